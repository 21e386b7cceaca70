package main

// The documentation's tests: README.md is the product page (short, no lab notebook, its
// commands and its example request work as written), and the reference pages under docs/
// match the code (every config field with its default, every metric the code exports, every
// test a guarantee names).

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/suite"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
)

// readmeMaxLines bounds README.md: a product page, not a lab notebook.
const readmeMaxLines = 250

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docFiles are the pages a reader follows from README.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 6 {
		t.Fatalf("docs/ has %d pages, want operating, configuration, metrics, peering, routing and bench", len(docs))
	}
	return append([]string{"README.md"}, docs...)
}

// Every test the documentation names (the fault table, the measurement commands) exists: a
// renamed or deleted test leaves no guarantee in the docs without its proof.
func TestDocsNameExistingTests(t *testing.T) {
	defined := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
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
	total := 0
	for _, f := range docFiles(t) {
		for _, n := range regexp.MustCompile(`\bTest[A-Z]\w*`).FindAllString(read(t, f), -1) {
			total++
			if !defined[n] {
				t.Errorf("%s names %s, which no _test.go file defines", f, n)
			}
		}
	}
	if total < 30 {
		t.Fatalf("the docs name %d tests; the fault table alone names more", total)
	}
}

// exportedMetrics are the metric families the code writes: every prefixlb_* name that opens
// a string literal in a non-test Go file outside bench/ (the bench reads metrics, it does not
// export them), less the name prefixes some literals are matched against.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile("[`\"](prefixlb_[a-z_]+)")
	out := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || path == "bench") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(src), -1) {
			if !strings.HasSuffix(m[1], "_") {
				out[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// docs/metrics.md lists exactly the families the code exports: a metric renamed in the code
// but not on the page, or the reverse, fails here (proxy's TestAdminMetricsAfterTraffic
// checks the families' labels after traffic).
func TestMetricsReferenceMatchesCode(t *testing.T) {
	code := exportedMetrics(t)
	if len(code) < 40 {
		t.Fatalf("found %d metric families in the code; the scan is broken", len(code))
	}
	page := read(t, filepath.Join("docs", "metrics.md"))
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(prefixlb_[a-z_]+)` \\|").FindAllStringSubmatch(page, -1) {
		if listed[m[1]] {
			t.Errorf("docs/metrics.md lists %s twice", m[1])
		}
		listed[m[1]] = true
		if !code[m[1]] {
			t.Errorf("docs/metrics.md lists metric %s, which no code writes", m[1])
		}
	}
	for m := range code {
		if !listed[m] {
			t.Errorf("the code writes metric %s, which docs/metrics.md's tables do not list", m)
		}
	}
}

// configLeaves walks the config's YAML schema: every field a user can write, by its dotted
// path (backends[].url), with the reflect path to read it in a Config. A type that decodes
// itself (Duration, OptionalInt, OptionalBool) is a leaf.
func configLeaves(t reflect.Type, prefix string, index []int, out map[string][]int) {
	unmarshaler := reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		path, idx := prefix+tag, append(append([]int(nil), index...), i)
		ft := f.Type
		switch {
		case reflect.PointerTo(ft).Implements(unmarshaler):
			out[path] = idx
		case ft.Kind() == reflect.Struct:
			configLeaves(ft, path+".", idx, out)
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct && !ft.Implements(unmarshaler):
			configLeaves(ft.Elem(), path+".", idx, out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			configLeaves(ft.Elem(), path+"[].", idx, out)
		default:
			out[path] = idx
		}
	}
}

// fieldValue reads the field at idx in v, taking the first element of a slice and following
// pointers; ok is false where a pointer is nil or a slice empty.
func fieldValue(v reflect.Value, idx []int) (reflect.Value, bool) {
	for _, i := range idx {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Slice {
			if v.Kind() == reflect.Pointer {
				if v.IsNil() {
					return v, false
				}
				v = v.Elem()
			} else {
				if v.Len() == 0 {
					return v, false
				}
				v = v.Index(0)
			}
		}
		v = v.Field(i)
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return v, false
		}
		v = v.Elem()
	}
	return v, true
}

// docDefault reports whether tok, the first `code` of a default cell, is the default v.
func docDefault(v reflect.Value, tok string) bool {
	switch x := v.Interface().(type) {
	case configs.Duration:
		d, err := time.ParseDuration(tok)
		return err == nil && d == x.D()
	case configs.OptionalInt:
		return tok == strconv.Itoa(x.V)
	case configs.OptionalBool:
		return tok == strconv.FormatBool(x.V)
	}
	switch v.Kind() {
	case reflect.String:
		return tok == v.String()
	case reflect.Bool:
		return tok == strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(tok, 10, 64)
		return err == nil && n == v.Int()
	case reflect.Float64:
		f, err := strconv.ParseFloat(tok, 64)
		return err == nil && f == v.Float()
	}
	return true // lists: documented in words
}

// docs/configuration.md has a row for every field of the config (a field added to configs/
// without its row fails here), no row for a field the config does not have, and each row's
// default is the one the code applies: the first `value` of the default cell equals the
// field's value in a parsed config that sets nothing (bools always; other zero values, such as
// "unset", are described in words).
func TestConfigurationReferenceCoversEveryField(t *testing.T) {
	leaves := map[string][]int{}
	configLeaves(reflect.TypeOf(configs.Config{}), "", nil, leaves)
	if len(leaves) < 55 {
		t.Fatalf("found %d config fields; the walk is broken", len(leaves))
	}
	// Every section present, so that each has its defaults applied.
	cfg, err := configs.Parse([]byte("backends: [{url: 'http://127.0.0.1:8000'}]\n" +
		"discovery: {dns: {name: vllm.default.svc.cluster.local, port: 8000}}\n" +
		"peering: {secret_env: PREFIXLB_PEERING_SECRET}\n"))
	if err != nil {
		t.Fatal(err)
	}
	// The fields that test config sets (they have no default).
	given := map[string]bool{"backends[].url": true, "discovery.dns.name": true, "discovery.dns.port": true, "peering.secret_env": true}
	// Defaults applied where the field is used rather than in the config.
	applied := map[string]any{"peering.settle_wait": configs.Duration(peering.DefaultSettleWait)}

	page := read(t, filepath.Join("docs", "configuration.md"))
	rowRE := regexp.MustCompile("(?m)^\\| `([a-z0-9_\\[\\].]+)` \\| ([^|]*) \\|")
	rows := map[string]string{}
	for _, m := range rowRE.FindAllStringSubmatch(page, -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("docs/configuration.md has two rows for %s", m[1])
		}
		rows[m[1]] = m[2]
	}
	for path := range rows {
		if _, ok := leaves[path]; !ok {
			t.Errorf("docs/configuration.md documents %s, which configs.Config does not have", path)
		}
	}
	for path, idx := range leaves {
		cell, ok := rows[path]
		if !ok {
			t.Errorf("config field %s has no row in docs/configuration.md", path)
			continue
		}
		if given[path] {
			continue
		}
		v, ok := fieldValue(reflect.ValueOf(cfg).Elem(), idx)
		if a, set := applied[path]; set {
			v, ok = reflect.ValueOf(a), true
		}
		if !ok || (v.IsZero() && v.Kind() != reflect.Bool && !strings.Contains(v.Type().Name(), "Optional")) {
			continue
		}
		tok := regexp.MustCompile("`([^`]*)`").FindStringSubmatch(cell)
		if tok == nil || !docDefault(v, tok[1]) {
			want := v.Interface()
			if d, ok := want.(configs.Duration); ok {
				want = d.D()
			}
			t.Errorf("docs/configuration.md gives %s the default %q; the code's is %v", path, strings.TrimSpace(cell), want)
		}
	}
}

// README.md stays a product page: at most readmeMaxLines lines, no commit hashes or run
// histories in it or the docs (those go to commit messages; bench/RESULTS.md names the commit
// of each result), and it names the test command that .ci/run runs.
func TestReadmeIsAProductPage(t *testing.T) {
	readme := read(t, "README.md")
	if n := strings.Count(readme, "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, want at most %d: move detail to docs/", n, readmeMaxLines)
	}
	if !strings.Contains(readme, "./test.sh") || !strings.Contains(read(t, filepath.Join(".ci", "run")), "./test.sh") {
		t.Error("README.md and .ci/run must both name the test command ./test.sh")
	}
	hash := regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	for _, f := range append(docFiles(t), filepath.Join("bench", "README.md")) {
		for _, h := range hash.FindAllString(read(t, f), -1) {
			if strings.ContainsAny(h, "0123456789") && strings.ContainsAny(h, "abcdef") {
				t.Errorf("%s names %q, which looks like a commit hash: the commit of a result belongs in bench/RESULTS.md, a history in commit messages", f, h)
			}
		}
	}
}

// markdownAnchors are the anchors of a Markdown page: GitHub's heading slugs and explicit
// <a id> targets.
func markdownAnchors(page string) map[string]bool {
	out := map[string]bool{}
	strip := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(page, "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimLeft(h, "#")
			slug := strings.ReplaceAll(strip.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
			out[slug] = true
		}
	}
	for _, m := range regexp.MustCompile(`<a id="([^"]+)">`).FindAllStringSubmatch(page, -1) {
		out[m[1]] = true
	}
	return out
}

// Every relative link of README.md, docs/ and the bench's pages resolves: the file exists and,
// for a link to a heading, the heading does.
func TestDocsLinksResolve(t *testing.T) {
	pages := append(docFiles(t), filepath.Join("bench", "README.md"), filepath.Join("bench", "RESULTS.md"))
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		text := read(t, page)
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(link, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, link)
				continue
			}
			if anchor != "" && !markdownAnchors(read(t, target))[anchor] {
				t.Errorf("%s links to %s: %s has no heading or anchor %q", page, link, target, anchor)
			}
		}
	}
}

// shellBlocks are the lines of a page's ```sh blocks, continuation lines joined.
func shellBlocks(page string) []string {
	var out []string
	in := false
	cont := ""
	for _, line := range strings.Split(page, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in:
			if strings.HasSuffix(line, "\\") {
				cont += strings.TrimSuffix(line, "\\")
				continue
			}
			out = append(out, cont+line)
			cont = ""
		}
	}
	return out
}

// commandTree is the prefixlb command as main builds it.
func commandTree() *cobra.Command {
	root := &cobra.Command{Use: "prefixlb"}
	b := bench.Command()
	b.AddCommand(overhead.Command(), suite.Command())
	root.AddCommand(app.ServeCommand(), app.HashKeyCommand(), sim.Command(), b, versionCommand())
	return root
}

// Every `prefixlb` command in README.md's shell blocks names a subcommand and flags that
// exist (a renamed flag fails here, not in a reader's terminal).
func TestReadmeCommandsParse(t *testing.T) {
	n := 0
	for _, line := range shellBlocks(read(t, "README.md")) {
		line, _, _ = strings.Cut(line, " #")
		line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line), "&"))
		args := strings.Fields(line)
		if len(args) == 0 || (args[0] != "./prefixlb" && args[0] != "prefixlb") {
			continue
		}
		n++
		cmd, rest, err := commandTree().Find(args[1:])
		if err != nil {
			t.Errorf("README command %q: %v", line, err)
			continue
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("README command %q: %v", line, err)
		}
	}
	if n < 2 {
		t.Fatalf("README.md has %d prefixlb commands; want at least sim and serve", n)
	}
}

// README.md's example config parses as a config, and its example request, sent twice through
// prefixlb in front of two simulated replicas, gets the routes the README says: cold, then a
// match of the prompt's first chunks on the same replica.
func TestReadmeExampleRequestRoutesAsDocumented(t *testing.T) {
	readme := read(t, "README.md")
	y := regexp.MustCompile("(?s)```yaml\n# prefixlb.yaml[^\n]*\n(.*?)```").FindStringSubmatch(readme)
	if y == nil {
		t.Fatal("README.md has no ```yaml block starting with # prefixlb.yaml")
	}
	if _, err := configs.Parse([]byte(y[1])); err != nil {
		t.Errorf("README.md's prefixlb.yaml does not parse: %v", err)
	}
	body := regexp.MustCompile(`(?s)curl -sN -i \S+/v1/chat/completions .*? -d '(\{.*?\})'`).FindStringSubmatch(readme)
	if body == nil || !json.Valid([]byte(body[1])) {
		t.Fatalf("README.md's example request is missing or not JSON: %v", body)
	}
	again := regexp.MustCompile("Send it again and the route is `([^`]*);predicted_ttft_us=").FindStringSubmatch(readme)
	first := regexp.MustCompile("X-Prefixlb-Route: ([a-z-]+;chunks=\\d+;cached=\\d+);predicted_ttft_us=").FindStringSubmatch(readme)
	if again == nil || first == nil {
		t.Fatal("README.md no longer shows the two routes of its example request")
	}

	c, err := sim.StartCluster(sim.DefaultConfig(), 2, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := &configs.Config{Listen: "127.0.0.1:0"}
	for _, u := range c.URLs() {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
	}
	sv, err := app.Start(context.Background(), cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		_ = sv.Stop(ctx)
	}()
	testutil.Eventually(t, testutil.Timeout, "both replicas healthy", func() bool {
		for _, b := range sv.Backends() {
			if !b.Healthy() {
				return false
			}
		}
		return true
	})
	send := func() (route, backend string) {
		t.Helper()
		resp, err := testutil.Client().Post(sv.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body[1]))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		stream, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(stream), "data: [DONE]") {
			t.Fatalf("example request: status %d, body %q", resp.StatusCode, stream)
		}
		return resp.Header.Get(proxy.HeaderRoute), resp.Header.Get("x-prefixlb-backend")
	}
	r1, b1 := send()
	r2, b2 := send()
	if !strings.HasPrefix(r1, first[1]+";") {
		t.Errorf("first route %q, README.md shows %q", r1, first[1])
	}
	if !strings.HasPrefix(r2, again[1]+";") || b2 != b1 {
		t.Errorf("second route %q on %s after %s, README.md says %q on the same replica", r2, b2, b1, again[1])
	}
}

// The figures of README.md's headline table are bench/RESULTS.md's: a re-run that replaces a
// table there leaves no stale figure on the front page.
func TestReadmeHeadlineMatchesResults(t *testing.T) {
	readme, results := read(t, "README.md"), read(t, filepath.Join("bench", "RESULTS.md"))
	header := strings.Index(readme, "\n| 4 replicas")
	if header < 0 {
		t.Fatal("README.md has no headline table (a header row starting with | 4 replicas)")
	}
	rows := 0
	for _, line := range strings.Split(readme[header+1:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		rows++
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for _, cell := range cells[1:] {
			for _, num := range regexp.MustCompile(`\d+(?:\.\d+)?`).FindAllString(cell, -1) {
				if !regexp.MustCompile(`[| ]` + regexp.QuoteMeta(num) + `[ ×]`).MatchString(results) {
					t.Errorf("README.md's headline gives %s (%q), which bench/RESULTS.md does not", num, strings.TrimSpace(cell))
				}
			}
		}
	}
	if rows < 1 {
		t.Fatal("README.md's headline table has no rows")
	}
}
