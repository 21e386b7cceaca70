package router

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestAbilitiesNamesEveryInterface: Abilities lists every interface the package declares
// beside Policy, so that the wrapper tests below see a new ability as soon as it is declared.
func TestAbilitiesNamesEveryInterface(t *testing.T) {
	listed := map[string]bool{"Policy": true}
	for _, a := range Abilities() {
		listed[a.Name()] = true
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	found := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			if _, ok := ts.Type.(*ast.InterfaceType); !ok {
				return true
			}
			found++
			if !listed[ts.Name.Name] {
				t.Errorf("interface %s (%s) is not in Abilities: a wrapper could drop it unseen", ts.Name.Name, fset.Position(ts.Pos()))
			}
			return true
		})
	}
	if found != len(listed) {
		t.Errorf("found %d interfaces, Abilities and Policy are %d", found, len(listed))
	}
}

// fullPolicy has every ability and records which of its methods were called.
type fullPolicy struct {
	mu     sync.Mutex
	called map[string]bool
}

func (p *fullPolicy) note(m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.called[m] = true
}

func (p *fullPolicy) Pick(*key.Key, []*backend.Backend) Decision { p.note("Pick"); return Decision{} }
func (p *fullPolicy) Preview(*key.Key, []*backend.Backend) Decision {
	p.note("Preview")
	return Decision{}
}
func (p *fullPolicy) SetBackends([]*backend.Backend)                { p.note("SetBackends") }
func (p *fullPolicy) ModelsChanged(*backend.Backend)                { p.note("ModelsChanged") }
func (p *fullPolicy) Learn(*key.Key, *backend.Backend, int) Learned { p.note("Learn"); return 1 }
func (p *fullPolicy) Unlearn(*key.Key, *backend.Backend, Learned)   { p.note("Unlearn") }
func (p *fullPolicy) Prefilled(*key.Key, *backend.Backend, Learned) { p.note("Prefilled") }
func (p *fullPolicy) Finished(*key.Key, *backend.Backend, Learned)  { p.note("Finished") }
func (p *fullPolicy) SettleWait(*key.Key, Decision) time.Duration   { p.note("SettleWait"); return 0 }
func (p *fullPolicy) Hold(*key.Key, Decision) Learned               { p.note("Hold"); return 1 }
func (p *fullPolicy) Release(*key.Key, Decision, Learned, time.Time) bool {
	p.note("Release")
	return false
}
func (p *fullPolicy) Abandon(*key.Key, *backend.Backend, Learned) { p.note("Abandon") }
func (p *fullPolicy) Correct(*key.Key, *backend.Backend, Learned, CacheReport) int {
	p.note("Correct")
	return 0
}
func (p *fullPolicy) Repick(*key.Key, Decision, []*backend.Backend, uint64) Decision {
	p.note("Repick")
	return Decision{}
}
func (p *fullPolicy) Index() *index.Index { p.note("Index"); return nil }
func (p *fullPolicy) Explain(*key.Key, []*backend.Backend) []CandidateEstimate {
	p.note("Explain")
	return nil
}
func (p *fullPolicy) ShadowStats() (ShadowStats, bool) {
	p.note("ShadowStats")
	return ShadowStats{}, true
}

// wantedMethods are the methods of Policy and of every ability (a method of an ability that
// embeds another once).
func wantedMethods(t *testing.T) []reflect.Method {
	var ms []reflect.Method
	seen := map[string]bool{}
	for _, a := range append([]reflect.Type{reflect.TypeFor[Policy]()}, Abilities()...) {
		if !reflect.TypeFor[*fullPolicy]().Implements(a) {
			t.Fatalf("fullPolicy lacks the ability %s: give it the new ability's methods", a.Name())
		}
		for i := range a.NumMethod() {
			if m := a.Method(i); !seen[m.Name] {
				seen[m.Name] = true
				ms = append(ms, m)
			}
		}
	}
	return ms
}

// ticketPaths are the ways to the policy's learning methods, which the proxy reaches through
// the request's Ticket only: each moves a fresh ticket to the transition that calls it.
var ticketPaths = map[string]func(tk *Ticket, b *backend.Backend){
	"Learn":      func(tk *Ticket, b *backend.Backend) { tk.Send(b, 1) },
	"Unlearn":    func(tk *Ticket, b *backend.Backend) { tk.Send(b, 1); tk.Refuse() },
	"Correct":    func(tk *Ticket, b *backend.Backend) { tk.Send(b, 1); tk.Report(100, 0) },
	"SettleWait": func(tk *Ticket, b *backend.Backend) { tk.SettleWait(Decision{Backend: b}) },
	"Hold":       func(tk *Ticket, b *backend.Backend) { tk.Hold(Decision{Backend: b}) },
	"Release":    func(tk *Ticket, b *backend.Backend) { tk.Hold(Decision{Backend: b}); tk.Release(time.Unix(1, 0)) },
	"Abandon":    func(tk *Ticket, b *backend.Backend) { tk.Hold(Decision{Backend: b}); tk.Refuse() },
	"Prefilled":  func(tk *Ticket, b *backend.Backend) { tk.Send(b, 1); tk.FirstToken() },
	"Finished":   func(tk *Ticket, b *backend.Backend) { tk.Send(b, 1); tk.Done() },
}

// abilityArg is a value of type typ that lets a Decider method reach its policy (a key that
// parsed, a backend, a stamp that is not 0).
func abilityArg(typ reflect.Type, bs []*backend.Backend) reflect.Value {
	switch typ {
	case reflect.TypeFor[*key.Key]():
		return reflect.ValueOf(routedKey(chunkChain(nil).extend("ability", 4)))
	case reflect.TypeFor[*backend.Backend]():
		return reflect.ValueOf(bs[0])
	case reflect.TypeFor[[]*backend.Backend]():
		return reflect.ValueOf(bs)
	case reflect.TypeFor[Decision]():
		return reflect.ValueOf(Decision{Backend: bs[0]})
	case reflect.TypeFor[Learned]():
		return reflect.ValueOf(Learned(1))
	case reflect.TypeFor[time.Time]():
		return reflect.ValueOf(time.Unix(1, 0))
	}
	return reflect.Zero(typ)
}

// TestDeciderForwardsEveryAbility: the Decider, built around a policy with every ability,
// reaches each method of Policy and of every ability: by a method of its own of that name, or
// for the learning lifecycle by a transition of the request's Ticket (ticketPaths); and each
// reaches the policy's own (Preview reaches Preview, not Pick; Refuse of a sent request
// Unlearn, of a held one Abandon).
func TestDeciderForwardsEveryAbility(t *testing.T) {
	bs := prefixBackends(t, 2)
	for _, m := range wantedMethods(t) {
		p := &fullPolicy{called: map[string]bool{}}
		d := NewDecider(p)
		if path, ok := ticketPaths[m.Name]; ok {
			tk := d.Ticket(abilityArg(reflect.TypeFor[*key.Key](), bs).Interface().(*key.Key))
			path(&tk, bs[0])
			if !p.called[m.Name] {
				t.Errorf("the ticket's way to %s did not reach the policy's (called: %v)", m.Name, p.called)
			}
			continue
		}
		dm := reflect.ValueOf(d).MethodByName(m.Name)
		if !dm.IsValid() {
			t.Errorf("neither the Decider nor its Ticket reaches %s: a policy's %s is out of the proxy's reach", m.Name, m.Name)
			continue
		}
		args := make([]reflect.Value, dm.Type().NumIn())
		for i := range args {
			args[i] = abilityArg(dm.Type().In(i), bs)
		}
		dm.Call(args)
		if !p.called[m.Name] {
			t.Errorf("Decider.%s did not reach the policy's %s (called: %v)", m.Name, m.Name, p.called)
		}
	}
}

// TestShadowExposesWhatItWraps: a Shadow has every ability of the policy it routes with and of
// its prefix policy.
func TestShadowExposesWhatItWraps(t *testing.T) {
	for _, mode := range shadowModes {
		actual, err := NewPolicy(mode, PolicyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewShadow(ShadowPrefix, mode, actual, PolicyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := reflect.TypeOf(s)
		for _, a := range Abilities() {
			for _, inner := range []reflect.Type{reflect.TypeOf(actual), reflect.TypeFor[*Prefix]()} {
				if inner.Implements(a) && !st.Implements(a) {
					t.Errorf("beside %s: %s is a %s, the Shadow around it is not", mode, inner, a.Name())
				}
			}
		}
	}
}

// TestShadowForwardsToActual: a Shadow hands its Actual policy each call of the abilities it
// forwards to it (Policy, Fleet, Repicker: Actual routes and keeps its own backends), each
// to Actual's own method.
func TestShadowForwardsToActual(t *testing.T) {
	bs := prefixBackends(t, 2)
	for _, a := range []reflect.Type{reflect.TypeFor[Policy](), reflect.TypeFor[Fleet](), reflect.TypeFor[Repicker]()} {
		for i := range a.NumMethod() {
			m := a.Method(i)
			actual := &fullPolicy{called: map[string]bool{}}
			s, err := NewShadow(ShadowPrefix, "round-robin", actual, PolicyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.SetBackends(bs)
			actual.called = map[string]bool{}
			sm := reflect.ValueOf(s).MethodByName(m.Name)
			args := make([]reflect.Value, sm.Type().NumIn())
			for j := range args {
				args[j] = abilityArg(sm.Type().In(j), bs)
			}
			sm.Call(args)
			if !actual.called[m.Name] {
				t.Errorf("Shadow.%s did not reach Actual's %s (called: %v)", m.Name, m.Name, actual.called)
			}
		}
	}
}
