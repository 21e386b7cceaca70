package configs

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// aliasBomb is a config of levels list entries, each merging width aliases of the one
// before it (<<: [*l0, *l0, …]): a few hundred bytes that stand for width^levels values.
// first is the first entry's body (a backend).
func aliasBomb(levels, width int, first string) string {
	var b strings.Builder
	b.WriteString("backends:\n  - &l0 {" + first + "}\n")
	for i := 1; i <= levels; i++ {
		refs := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), width), ", ")
		fmt.Fprintf(&b, "  - &l%d {<<: [%s]}\n", i, refs)
	}
	return b.String()
}

// parseWithin is Parse's error, failing the test if Parse has not returned within limit: a
// guard against a hang (a walk that expanded every alias), not a timing.
func parseWithin(t *testing.T, data string, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := Parse([]byte(data))
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("Parse of a %d-byte file still running after %v", len(data), limit)
		return nil
	}
}

// An alias bomb (9 levels of 10 merge keys, 10^9 values) is refused with one
// bounded line: the first wrong value, or yaml's refusal of the aliasing said in the file's
// terms; the walk that names the field checks each aliased node once.
func TestAliasBombRefused(t *testing.T) {
	for _, c := range []struct{ name, first, want string }{
		{"a wrong value inside", "url: http://127.0.0.1:1, weight: x", `config: backends[0].weight: line 2: want an integer, got the string "x"`},
		{"every value right", "url: http://127.0.0.1:1", "config: aliases and merge keys (<<) expand the document too far"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := parseWithin(t, aliasBomb(9, 10, c.first), 10*time.Second)
			if err == nil {
				t.Fatal("Parse accepted the alias bomb")
			}
			got := err.Error()
			if !strings.HasPrefix(got, c.want) || len(got) > 300 || strings.Contains(got, "\n") {
				t.Errorf("error %q (%d bytes), want one bounded line starting %q", got, len(got), c.want)
			}
		})
	}
}

// A bomb small enough for yaml.v3 to decode (3 levels of 10: 1,000 backends' worth) is
// walked once per aliased node, so a wrong value in it is one error, not one per use.
func TestAliasedErrorCountedOnce(t *testing.T) {
	err := parseWithin(t, aliasBomb(3, 10, "url: http://127.0.0.1:1, weight: x"), 10*time.Second)
	want := `config: backends[0].weight: line 2: want an integer, got the string "x"`
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

// The walk stops at its bounds with an error naming where and why: a merge chain deeper
// than maxWalkDepth, and (bounds lowered) a document of more values than the walk visits.
func TestWalkBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("backends:\n  - ")
	const deep = maxWalkDepth + 50
	for i := range deep {
		fmt.Fprintf(&b, "&m%d {<<: ", i)
	}
	b.WriteString("{url: http://127.0.0.1:2}" + strings.Repeat("}", deep) + "\n")
	err := parseWithin(t, b.String(), 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("nested deeper than %d levels", maxWalkDepth)) {
		t.Errorf("deep merge chain: error %v, want one saying it is nested deeper than %d levels", err, maxWalkDepth)
	}

	models := strings.TrimSuffix(strings.Repeat("m, ", 500), ", ")
	doc := "backends:\n  - url: http://127.0.0.1:1\n    models: [" + models + "]\n"
	if err := walkErrorWithin([]byte(doc), 1000, maxWalkDepth); err != nil {
		t.Fatalf("500 values within a bound of 1000: %v", err)
	}
	err = walkErrorWithin([]byte(doc), 100, maxWalkDepth)
	if err == nil || !strings.Contains(err.Error(), "has over 100 values to check") {
		t.Errorf("500 values over a bound of 100: error %v, want one saying so", err)
	}
}
