package configs

// Decoding errors in the file's terms. yaml.v3 reports a value of the wrong type as
// "line N: cannot unmarshal !!str `abc` into float64", one line per error under a header:
// the line, and Go's type, but not the field. decodeError walks the document beside the
// Config's type to find the first value that does not decode, and names it by its path
// (prefix.hard_load_factor, backends[0].models[1]), as Validate's errors do, with its line
// and what the field wants, on one line.
//
// The walk is bounded whatever the document: aliases and merge keys (<<) can make a file of
// a few hundred bytes stand for billions of values (an alias bomb), so each anchored node is
// checked once per type it is used as (walkKey), the walk stops after maxWalkNodes values or
// maxWalkDepth levels, and only the first error's text is kept.

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxQuotedValue bounds the part of a wrong value that an error quotes, bytes.
const maxQuotedValue = 40

// Bounds of the walk (errWalk). A configuration has hundreds of values and a few levels of
// nesting (backends[i].models[j] is the deepest, plus a merge key or two); these bounds are
// far beyond any real file and keep the walk of a hostile one within milliseconds and a few
// megabytes.
const (
	// maxWalkNodes is how many values the walk visits at most.
	maxWalkNodes = 1 << 20
	// maxWalkDepth is how deep the walk descends, aliases and merges included.
	maxWalkDepth = 200
)

// selfDecoder is the interface of the types that decode themselves (Duration, OptionalInt, OptionalBool).
var selfDecoder = reflect.TypeFor[yaml.Unmarshaler]()

// decodeError rewrites err, yaml's error decoding data into a Config, as one line naming the
// first field at fault, its line, and the number of other errors. An error it cannot place
// (a syntax error: the document does not parse) is yaml's, on one line.
func decodeError(data []byte, err error) error {
	if placed := walkError(data); placed != nil {
		return placed
	}
	msg := oneLine(err.Error())
	if strings.Contains(msg, "excessive aliasing") {
		// yaml.v3's refusal of an alias bomb, which says neither what nor where.
		return fmt.Errorf("config: aliases and merge keys (<<) expand the document too far (%s)", msg)
	}
	return fmt.Errorf("config: %s", msg)
}

// walkError is the first value of data, a document that decoded into a Config or did not,
// that does not fit its field, as decodeError words it; nil when every value fits (or data
// does not parse). It also catches what yaml.v3 lets through: a number with a fraction in
// an integer field, which yaml.v3 truncates (kv_cache_tokens: 1000.7 read as 1000).
func walkError(data []byte) error { return walkErrorWithin(data, maxWalkNodes, maxWalkDepth) }

// walkErrorWithin is walkError with the walk's bounds given.
func walkErrorWithin(data []byte, maxNodes, maxDepth int) error {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	w := errWalk{done: map[walkKey]bool{}, maxNodes: maxNodes, maxDepth: maxDepth}
	w.value(&doc, reflect.TypeFor[Config](), "")
	if w.errs == 0 {
		return nil
	}
	msg := w.first
	if n := w.errs - 1; n == 1 {
		msg += " (and 1 more error)"
	} else if n > 1 {
		msg += fmt.Sprintf(" (and %d more errors)", n)
	}
	return fmt.Errorf("config: %s", msg)
}

// oneLine joins yaml's multi-line error ("yaml: unmarshal errors:\n  line 2: …\n  line 3: …").
func oneLine(s string) string {
	s = strings.TrimPrefix(s, "yaml: unmarshal errors:\n  ")
	return strings.ReplaceAll(s, "\n  ", "; ")
}

// errWalk counts, in document order, the values that do not decode, and keeps the first
// one's error.
type errWalk struct {
	first string
	errs  int
	// done holds the anchored nodes already checked as a type: an alias of one is not checked
	// again (its errors were counted where it was first met).
	done map[walkKey]bool
	// nodes is how many values were visited, depth how deep the walk is now; stopped is set
	// once either passed its bound (maxNodes, maxDepth), after which nothing more is visited.
	nodes, depth       int
	maxNodes, maxDepth int
	stopped            bool
}

// walkKey is an anchored node checked as a t: as a value, or as a merge key's list of sources.
type walkKey struct {
	n     *yaml.Node
	t     reflect.Type
	merge bool
}

func (w *errWalk) fail(n *yaml.Node, path, format string, args ...any) {
	w.errs++
	if w.errs > 1 {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if path == "" {
		w.first = fmt.Sprintf("line %d: %s", n.Line, msg)
		return
	}
	w.first = fmt.Sprintf("%s: line %d: %s", path, n.Line, msg)
}

// enter counts a visit to n at one level deeper and reports whether the walk may go on;
// the caller that got true calls leave when done. Past a bound the walk fails once, at n,
// and stops.
func (w *errWalk) enter(n *yaml.Node, path string) bool {
	if w.stopped {
		return false
	}
	w.nodes++
	w.depth++
	switch {
	case w.nodes > w.maxNodes:
		w.stop(n, path, fmt.Sprintf("the document has over %d values to check (aliases and merge keys included)", w.maxNodes))
		return false
	case w.depth > w.maxDepth:
		w.stop(n, path, fmt.Sprintf("nested deeper than %d levels (aliases and merge keys included)", w.maxDepth))
		return false
	}
	return true
}

func (w *errWalk) leave() { w.depth-- }

// stop ends the walk with an error at n; it is the one reported unless an error came before.
func (w *errWalk) stop(n *yaml.Node, path, msg string) {
	w.depth--
	w.stopped = true
	w.fail(n, path, "%s", msg)
}

// once reports whether n is met as a t (merge: as a merge key's list of sources) for the
// first time, and marks it met. Only an anchored node (&name) can be met again, through an
// alias; any other is met once.
func (w *errWalk) once(n *yaml.Node, t reflect.Type, merge bool) bool {
	if n.Anchor == "" {
		return true
	}
	k := walkKey{n, t, merge}
	if w.done[k] {
		return false
	}
	w.done[k] = true
	return true
}

// value checks that n decodes into a t at path.
func (w *errWalk) value(n *yaml.Node, t reflect.Type, path string) {
	if !w.once(n, t, false) || !w.enter(n, path) {
		return
	}
	defer w.leave()
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 1 {
			w.value(n.Content[0], t, path)
		}
		return
	case yaml.AliasNode:
		if n.Alias != nil {
			w.value(n.Alias, t, path)
		}
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // leaves the field as it is
	}
	for t.Kind() == reflect.Pointer && !t.Implements(selfDecoder) {
		t = t.Elem()
	}
	selfDecoding := reflect.PointerTo(t).Implements(selfDecoder) || t.Implements(selfDecoder)
	switch {
	case selfDecoding:
		w.leaf(n, t, path)
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, "want a mapping, got %s", got(n))
			return
		}
		w.fields(n, t, path, map[string]int{})
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
		// Each value checked at path.key, so that a wrong one is named (objectives.critical).
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, "want a mapping, got %s", got(n))
			return
		}
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if first, dup := seen[k.Value]; dup {
				w.fail(k, p, "already set at line %d", first)
				continue
			}
			seen[k.Value] = k.Line
			w.value(v, t.Elem(), p)
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "want a list, got %s", got(n))
			return
		}
		for i, e := range n.Content {
			w.value(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		w.leaf(n, t, path)
	}
}

// fields checks the keys and values of mapping n against struct t; seen holds the keys met
// so far and their lines.
func (w *errWalk) fields(n *yaml.Node, t reflect.Type, path string, seen map[string]int) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			w.merge(v, t, path)
			continue
		}
		p := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			w.fail(k, p, "already set at line %d", first)
			continue
		}
		seen[k.Value] = k.Line
		ft, ok := fieldType(t, k.Value)
		if !ok {
			w.fail(k, p, "unknown field")
			continue
		}
		w.value(v, ft, p)
	}
}

// merge checks the mappings a merge key (<<) brings in; their keys may be overridden.
func (w *errWalk) merge(v *yaml.Node, t reflect.Type, path string) {
	// A mapping merged is checked as the value of a t is (fields); a list of them is not.
	if !w.once(v, t, v.Kind != yaml.MappingNode) || !w.enter(v, path) {
		return
	}
	defer w.leave()
	switch v.Kind {
	case yaml.AliasNode:
		if v.Alias != nil {
			w.merge(v.Alias, t, path)
		}
	case yaml.MappingNode:
		w.fields(v, t, path, map[string]int{})
	case yaml.SequenceNode:
		for _, e := range v.Content {
			w.merge(e, t, path)
		}
	}
}

// leaf checks that n decodes into a t: yaml.v3's own decoding, so that what passes here
// passes there.
func (w *errWalk) leaf(n *yaml.Node, t reflect.Type, path string) {
	if want(t) == "an integer" && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
		if f, err := strconv.ParseFloat(n.Value, 64); err != nil || f != math.Trunc(f) {
			w.fail(n, path, "want %s, got %s", want(t), got(n)) // yaml.v3 would truncate it
			return
		}
	}
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return
	}
	if _, typeErr := err.(*yaml.TypeError); typeErr {
		w.fail(n, path, "want %s, got %s", want(t), got(n))
		return
	}
	// A type's own error (Duration's): its message, without the line it names itself.
	w.fail(n, path, "%s", lineRE.ReplaceAllString(oneLine(err.Error()), ""))
}

// lineRE is the "line N: " that yaml's and Duration's messages start with.
var lineRE = regexp.MustCompile(`^line \d+: `)

// fieldType is the type of t's field named key in YAML (yaml.v3's naming: the tag's name,
// else the Go name in lower case).
func fieldType(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name == key {
			return f.Type, true
		}
	}
	return nil, false
}

// join is path.key, or key at the top.
func join(path, key string) string {
	if len(key) > maxQuotedValue {
		key = key[:maxQuotedValue] + "…"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// want says what a field of type t takes.
func want(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[Duration]():
		return "a duration (e.g. 500ms, 5s, 10m)"
	case reflect.TypeFor[OptionalInt]():
		return "an integer"
	case reflect.TypeFor[OptionalBool]():
		return "true or false"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Pointer:
		return want(t.Elem())
	}
	return "a mapping"
}

// got describes the value n: a list, a mapping, the string quoted, or another scalar as
// written (a number, a boolean), each cut to its bound.
func got(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	v, cut := n.Value, ""
	if len(v) > maxQuotedValue {
		v, cut = v[:maxQuotedValue], "…"
	}
	if n.ShortTag() == "!!str" {
		return fmt.Sprintf("the string %q%s", v, cut)
	}
	return fmt.Sprintf("%s%s", strings.ToValidUTF8(v, "?"), cut)
}
