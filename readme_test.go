package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every test the README names (the fault table, the measurement commands) exists: a renamed or
// deleted test leaves no guarantee in the README without its proof.
func TestReadmeNamesExistingTests(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`\bTest[A-Z]\w*`).FindAllString(string(readme), -1)
	if len(named) < 30 {
		t.Fatalf("README names %d tests; the fault table alone names more", len(named))
	}
	for _, n := range named {
		if !defined[n] {
			t.Errorf("README names %s, which no _test.go file defines", n)
		}
	}
}

// Every metric family the README lists is written by the code (a metric renamed in the code
// but not in the README, or the reverse, fails here; proxy's TestAdminMetricsAfterTraffic
// checks the families' labels after traffic).
func TestReadmeMetricsExist(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, dir := range []string{"proxy", "peering"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	code := src.String()
	metricRE := regexp.MustCompile("`(prefixlb_[a-z_]+)`")
	seen := 0
	for _, m := range metricRE.FindAllStringSubmatch(string(readme), -1) {
		seen++
		if !strings.Contains(code, m[1]) {
			t.Errorf("README lists metric %s, which neither proxy/ nor peering/ writes", m[1])
		}
	}
	if seen < 17 {
		t.Fatalf("README lists %d metric names, want the whole table", seen)
	}
	for _, m := range regexp.MustCompile(`prefixlb_[a-z_]+`).FindAllString(code, -1) {
		if !strings.Contains(string(readme), m) {
			t.Errorf("proxy/ or peering/ writes metric %s, which the README's table does not list", m)
		}
	}
}
