package workload

import (
	"math"
	"testing"
	"time"
)

func TestFairLoad(t *testing.T) {
	for _, c := range []struct {
		in      string
		load    float64
		ok, bad bool
	}{
		{"fair10x", 6.6, true, false},
		{"fair10x:0.4", 4.4, true, false},
		{"fair10x:1", 11, true, false},
		{"overload", 0, false, false},
		{"2", 0, false, false},
		{"", 0, false, false},
		{"fair10x:", 0, true, true},
		{"fair10x:0", 0, true, true},
		{"fair10x:-1", 0, true, true},
		{"fair10x:x", 0, true, true},
		{"fair10x0.4", 0, true, true},
		{"fair10x:Inf", 0, true, true},
	} {
		load, ok, err := FairLoad(c.in)
		if ok != c.ok || (err != nil) != c.bad || math.Abs(load-c.load) > 1e-12 {
			t.Errorf("FairLoad(%q) = %g, %v, %v; want %g, %v, error %v", c.in, load, ok, err, c.load, c.ok, c.bad)
		}
	}
}

func fairParams(replicas int, load float64) OverloadParams {
	p := overloadParams(replicas, load)
	p.Mix = MixFair
	return p
}

func TestFairTenantRates(t *testing.T) {
	for _, c := range []struct {
		replicas int
		load     float64
	}{{2, 6.6}, {4, 6.6}, {2, 4.4}, {3, 1}} {
		w, err := Overload(fairParams(c.replicas, c.load))
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Tenants) != 2 {
			t.Fatalf("%d tenants, want light and heavy", len(w.Tenants))
		}
		light, heavy := w.Tenants[0], w.Tenants[1]
		if light.Name != "light" || heavy.Name != "heavy" {
			t.Fatalf("tenants %s, %s", light.Name, heavy.Name)
		}
		for _, tn := range w.Tenants {
			if got := tn.Rate * tn.CostMs / 1000 / float64(c.replicas); math.Abs(got-tn.Share) > 1e-9 {
				t.Errorf("%s: rate %.3f × %.2f ms on %d replicas = %.4f of the capacity, share says %.4f", tn.Name, tn.Rate, tn.CostMs, c.replicas, got, tn.Share)
			}
		}
		if math.Abs(light.Share+heavy.Share-c.load) > 1e-9 || math.Abs(light.Share*(1+FairFactor)-c.load) > 1e-9 {
			t.Errorf("load %g: light %g + heavy %g", c.load, light.Share, heavy.Share)
		}
		// Equal priority, equal shape and cost, their own flows and keys, 10× the rate.
		if math.Abs(heavy.Rate-FairFactor*light.Rate) > 1e-9 || heavy.Priority != light.Priority || heavy.CostMs != light.CostMs ||
			heavy.Objective != light.Objective || heavy.FairnessID == light.FairnessID || heavy.APIKey == light.APIKey {
			t.Errorf("light %+v heavy %+v", *light, *heavy)
		}
		if w.Params["mix"] != MixFair || w.Name != "overload" {
			t.Errorf("name %s params %v", w.Name, w.Params)
		}
	}
	// The figures the docs quote: 132 ms a request; 2 replicas at the preset get light 9.1 and
	// heavy 91 requests/s.
	load, _, _ := FairLoad(MixFair)
	ts, err := fairTenants(fairParams(2, load))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(ts[0].CostMs-132.2) > 0.1 || math.Abs(ts[0].Rate-9.08) > 0.01 || math.Abs(ts[1].Rate-90.8) > 0.1 || ts[0].Share != FairLightShare {
		t.Errorf("light %.2f ms, %.3f req/s, share %g; heavy %.2f req/s", ts[0].CostMs, ts[0].Rate, ts[0].Share, ts[1].Rate)
	}
	for _, p := range []OverloadParams{fairParams(2, 0), fairParams(2, math.Inf(1)), fairParams(0, 6.6)} {
		if _, err := Overload(p); err == nil {
			t.Errorf("load %g on %d replicas accepted", p.Load, p.Replicas)
		}
	}
	p := fairParams(2, 6.6)
	p.Mix = "fair3x"
	if _, err := Overload(p); err == nil {
		t.Error("an unknown mix was accepted")
	}
}

func TestFairArrivals(t *testing.T) {
	p := fairParams(2, 6.6)
	p.Duration = 30 * time.Second
	w, err := Overload(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil || w.Loop != Open || w.API != Chat {
		t.Fatalf("workload %v, loop %s, api %s", err, w.Loop, w.API)
	}
	at := map[string][]time.Duration{}
	system := map[string]string{}
	questions := map[string]bool{}
	for i, c := range w.Conversations {
		if c.ID != i || c.Tenant == nil || (i > 0 && c.At < w.Conversations[i-1].At) || c.At < 0 || c.At >= p.Duration {
			t.Fatalf("conversation %d: id %d, tenant %v, at %s", i, c.ID, c.Tenant, c.At)
		}
		n := c.Tenant.Name
		// The same shape for both: one turn, a system prompt shared by the tenant's requests,
		// a question of its own.
		if len(c.Turns) != 1 || CountWords(c.System) != FairSystemTokens || CountWords(c.Turns[0].User) != FairQuestionTokens ||
			c.Turns[0].MaxTokens != FairOutputTokens || c.Turns[0].Think != 0 {
			t.Fatalf("%s request: %d turns, %d system words, %d question words, max_tokens %d", n, len(c.Turns),
				CountWords(c.System), CountWords(c.Turns[0].User), c.Turns[0].MaxTokens)
		}
		if s, ok := system[n]; ok && s != c.System {
			t.Fatalf("%s: two system prompts", n)
		}
		system[n] = c.System
		if questions[c.Turns[0].User] {
			t.Fatalf("%s: a question sent twice", n)
		}
		questions[c.Turns[0].User] = true
		at[n] = append(at[n], c.At)
	}
	if system["light"] == system["heavy"] {
		t.Error("light and heavy share a system prompt: one's cache hits would be the other's")
	}
	for _, tn := range w.Tenants {
		mean := tn.Rate * p.Duration.Seconds()
		if got := float64(len(at[tn.Name])); math.Abs(got-mean) > 4*math.Sqrt(mean) {
			t.Errorf("%s: %g arrivals in %s, expected %.1f", tn.Name, got, p.Duration, mean)
		}
		if cv := gapCV(at[tn.Name]); cv < 0.8 || cv > 1.2 {
			t.Errorf("%s: arrival gaps' coefficient of variation %.2f, a Poisson process has 1", tn.Name, cv)
		}
	}
	if r := float64(len(at["heavy"])) / float64(len(at["light"])); r < 8 || r > 12 {
		t.Errorf("heavy sent %.1f× light's requests, want about %d×", r, FairFactor)
	}
}

func TestFairDeterministicBySeed(t *testing.T) {
	p := fairParams(2, 6.6)
	p.Duration = 10 * time.Second
	checkSeedAndAlone(t, p, "light")
	// The mix's tenants only.
	for _, ts := range [][]string{{"chat"}, {"light", "batch"}} {
		p.Tenants = ts
		if _, err := Overload(p); err == nil {
			t.Errorf("tenants %v accepted in the %s mix", ts, MixFair)
		}
	}
	p.Mix, p.Load, p.Tenants = "", 2, []string{"light"}
	if _, err := Overload(p); err == nil {
		t.Error("light accepted in the three-tenant mix")
	}
}
