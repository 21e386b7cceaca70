package proxy

import "github.com/prefixlb/prefixlb/router"

// correctIndex hands what the backend reported cached for a completed request to the policy,
// so that its prefix index corrects itself when the backend held far less than the index
// listed (router.Shortfall, index.Index.Correct). Only a complete response with a usage
// object counts, and only for the attempt whose Learn stands (f.learned: the request was
// learned on that backend and not withdrawn).
func (s *Server) correctIndex(f *flow, res result) {
	b := f.lease.Backend()
	if res != resultOK || f.learned == 0 || f.usagePrompt <= 0 || b == nil || f.dec.Backend != b {
		return
	}
	s.decider.Correct(&f.k, b, f.learned, router.CacheReport{MatchedChunks: f.dec.MatchedChunks,
		ReportedPrompt: f.usagePrompt, ReportedCached: f.usageCached})
}
