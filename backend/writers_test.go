package backend

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// writers is who writes each group of a Backend's state: a group's setters may be used
// (called, or taken as a method value) only in its owners, directories relative to the
// module root, and in package backend itself. Tests are free to set any state they build on.
// "Lease" stands for any use of the Lease type: its methods write Counts, and the drain.
var writers = []struct {
	group   string
	owners  []string
	setters []string
}{
	{"Settings and configured models: the config (a reload, the backends it builds)",
		[]string{"proxy", "app"}, []string{"SetKVCacheTokens", "SetWeight", "SetMaxConcurrency", "SetConfiguredModels"}},
	{"HealthReport and discovered models: the health checker",
		[]string{"health"}, []string{"SetHealthy", "SetNeverPassed", "SetScrapedLoad", "SetScrapedRequests", "SetScrapedKVUsage",
			"SetScrapedKVCacheTokens", "SetOtherSenders", "SetDiscoveredModels"}},
	{"PeerLoad, the peers' prefill samples and the load signal: peering",
		[]string{"peering"}, []string{"SetPeerLoad", "ObservePrefill", "SharePrefillSamples", "TakePrefillSamples", "NotifyLoad"}},
	{"Counts: this proxy's requests (bench/overhead drives Leases as the proxy does), and the room signal its flow control waits on",
		[]string{"proxy", "bench/overhead"}, []string{"Lease", "SetReportsCachedTokens", "NotifyRoom"}},
	{"the pooled prefill model: the prefix policy",
		[]string{"router"}, []string{"SetFleetPrefill"}},
	{"the cache epoch: the health checker's restarts and returns, the proxy's removals",
		[]string{"health", "proxy"}, []string{"ResetCache"}},
}

// ownersOf maps each setter to its owners.
func ownersOf() map[string][]string {
	m := map[string][]string{}
	for _, w := range writers {
		for _, s := range w.setters {
			m[s] = w.owners
		}
	}
	return m
}

const backendImport = "github.com/prefixlb/prefixlb/backend"

// writerViolations walks the non-test Go files of the module in fsys and returns, sorted, a
// line for every use of a setter outside its owners, and for every declaration of a function
// or method named as a setter outside package backend (the check goes by name, so a name
// must stay unique to backend).
func writerViolations(fsys fs.FS) ([]string, error) {
	owners := ownersOf()
	fset := token.NewFileSet()
	var out []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != "." && (n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir := path.Dir(p)
		if dir == "backend" {
			return nil
		}
		src, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imported := "" // the name the file gives package backend ("" if not imported)
		for _, im := range f.Imports {
			if v, _ := strconv.Unquote(im.Path.Value); v == backendImport {
				imported = "backend"
				if im.Name != nil {
					imported = im.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if _, ok := owners[n.Name.Name]; ok {
					out = append(out, fmt.Sprintf("%s: declares %s, the name of a backend setter (the check goes by name; rename one)", fset.Position(n.Name.Pos()), n.Name.Name))
				}
			case *ast.SelectorExpr:
				name := n.Sel.Name
				if name == "Lease" {
					if x, ok := n.X.(*ast.Ident); !ok || imported == "" || x.Name != imported {
						return true
					}
				}
				if o, ok := owners[name]; ok && !slices.Contains(o, dir) {
					out = append(out, fmt.Sprintf("%s: %s uses %s, which only %s may (backend/writers_test.go)", fset.Position(n.Sel.Pos()), dir, name, strings.Join(o, ", ")))
				}
			}
			return true
		})
		return nil
	})
	slices.Sort(out)
	return out, err
}

// TestOneWriterPerGroup: in the module's code (tests aside), each group of a Backend's state
// is written only by its owners.
func TestOneWriterPerGroup(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	bad, err := writerViolations(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// TestWriterMapComplete: every Set method of Backend is in the map, and every name the map
// lists is a method of Backend (or the Lease type), so that a new setter cannot skip the
// check and a renamed one does not leave the map checking nothing.
func TestWriterMapComplete(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{"Lease": true}
	var sets []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || !fd.Name.IsExported() {
					continue
				}
				if st, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
					if id, ok := st.X.(*ast.Ident); ok && id.Name == "Backend" {
						declared[fd.Name.Name] = true
						if n := fd.Name.Name; len(n) > 3 && strings.HasPrefix(n, "Set") && unicode.IsUpper(rune(n[3])) {
							sets = append(sets, fd.Name.Name)
						}
					}
				}
			}
		}
	}
	owners := ownersOf()
	for _, s := range sets {
		if _, ok := owners[s]; !ok {
			t.Errorf("Backend.%s is not in writers: name the package that writes it", s)
		}
	}
	for s := range owners {
		if !declared[s] {
			t.Errorf("writers lists %s, which Backend does not declare", s)
		}
	}
}

// TestWriterViolations: the check finds a setter used outside its owners, through a method
// value or a renamed import too, and a Lease outside the proxy; it passes owners, tests and
// package backend itself.
func TestWriterViolations(t *testing.T) {
	file := func(pkg, body string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte("package " + pkg + "\n\nimport be \"" + backendImport + "\"\n\n" + body + "\n")}
	}
	fsys := fstest.MapFS{
		"go.mod":                 {Data: []byte("module github.com/prefixlb/prefixlb\n")},
		"health/scrape.go":       file("health", "func f(b *be.Backend) { b.SetScrapedLoad(1, 0) }"),
		"router/prefix.go":       file("router", "func f(b *be.Backend) { b.SetScrapedKVUsage(0.5); _ = b.SetOtherSenders }"),
		"router/prefix_test.go":  file("router", "func g(b *be.Backend) { b.SetScrapedLoad(1, 0) }"),
		"proxy/flow.go":          file("proxy", "type flow struct{ lease be.Lease }"),
		"peering/flush.go":       file("peering", "func f() { var l be.Lease; l.Release() }"),
		"backend/backend.go":     {Data: []byte("package backend\n\nfunc f(b *Backend) { b.SetWeight(1) }\n")},
		"bench/sim/engine.go":    file("sim", "func SetWeight() {}"),
		"router/testdata/x.go":   file("x", "func f(b *be.Backend) { b.SetHealthy(true) }"),
		"app/options.go":         file("app", "func f(b *be.Backend) { b.SetConfiguredModels(nil) }"),
		"internal/testutil/x.go": file("testutil", "func f(b *be.Backend) int64 { return b.InFlight() }"),
	}
	got, err := writerViolations(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bench/sim/engine.go:5:6: declares SetWeight",
		"peering/flush.go:5:21: peering uses Lease",
		"router/prefix.go:5:27: router uses SetScrapedKVUsage",
		"router/prefix.go:5:57: router uses SetOtherSenders",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("violation %d: %q, want it to start %q", i, got[i], want[i])
		}
	}
}
