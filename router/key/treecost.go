package key

// The fastjson path's cost. fastjson's parse tree takes a copy of the body, a Value (80
// bytes) per JSON string, number, object and array, and a slot in its object (24 bytes) or
// array (8 bytes); while its value cache and each container's slice grow, the old copies stay
// alive too (the tree points into them): about 500 bytes a value in all, so a body of tiny
// values costs up to 230 times its size (a 12 MB list of token ids: 2.8 GB;
// TestKeyingMemoryReport). The fast path reads every routed API's prompt, and the model of
// the model-only endpoints, without a tree; the fastjson path is left the bodies it hands back
// (NaN or Inf, nesting past maxFastDepth, a field of the wrong type, JSON that does not
// parse), and parses one only when its tree is affordable: at most maxTreeValues values,
// which with what the fast path allocated before handing it back cost at most the body's
// size beyond the copy (and treeValuesFloor's megabyte). A body over that is keyed like one
// that does not parse: parse-fallback routing in its model's pool, its model and stream flag
// read by the lenient scan (model_fallback.go).
import "bytes"

const (
	// treeBytesPerValue is what a value of a parse tree costs at most, its share of the
	// slices' growth included; the most is at small sizes (TestKeyingMemoryReport prints
	// what the worst shapes allocate).
	treeBytesPerValue = 1024
	// treeValuesFloor is the values a tree may have whatever the body's size, so that a
	// small body handed back keys as it always has: 1 MiB at most.
	treeValuesFloor = 1024
)

// maxTreeValues is the most values that the parse tree of a body of n bytes may have, spent
// bytes of it taken already: the tree and what the fast path may have allocated before it
// handed the body back (its arena: the body's size, when the body has escapes) cost at most
// the body's size together, beyond the floor.
func maxTreeValues(n, spent int) int { return treeValuesFloor + max(n-spent, 0)/treeBytesPerValue }

// treeAffordable reports whether fastjson may parse body: at most maxTreeValues values. It
// depends on the body alone, so a body keys alike however its scratch memory was pooled.
func treeAffordable(body []byte) bool {
	spent := 0
	if bytes.IndexByte(body, '\\') >= 0 {
		spent = len(body)
	}
	limit := maxTreeValues(len(body), spent)
	return jsonValues(body, limit) <= limit
}

// jsonValues returns an upper bound of the values that fastjson allocates for body (one more
// than the '{', '[' and ',' outside strings: every value but the body's own follows one of
// those), or a number over limit once the count passes it. Strings are stepped over as
// fastjson finds their end; an unterminated one ends the count (fastjson stops there too).
func jsonValues(b []byte, limit int) int {
	n := 1
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := stringEnd(b, i)
			if end < 0 {
				return n
			}
			i = end - 1
		case '{', '[', ',':
			if n++; n > limit {
				return n
			}
		}
	}
	return n
}
