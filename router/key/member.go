package key

// TopLevelInt returns the first of names found as a top-level member of the JSON object in
// body whose value is a non-negative integer (digits only, at most 12), scanned as
// fallbackModel scans (nested values skipped by bracket counting, no parse tree). Flow
// control reads a request's max_tokens with it, only for a request it queues.
func TopLevelInt(body []byte, names ...string) (int64, bool) {
	for _, name := range names {
		v := topLevelMember(body, name)
		if len(v) == 0 || len(v) > 12 {
			continue
		}
		var n int64
		ok := true
		for _, c := range v {
			if c < '0' || c > '9' {
				ok = false
				break
			}
			n = n*10 + int64(c-'0')
		}
		if ok {
			return n, true
		}
	}
	return 0, false
}
