package proxy

// correctIndex hands what the backend reported cached for a completed request to the policy,
// so that its prefix index corrects itself when the backend held far less than the index
// listed (router.Shortfall, index.Index.Correct; the ticket reported). Only a complete
// response with a usage object counts, and only for the attempt whose Learn stands
// (router.Ticket.Stands: the request was learned on that backend and not withdrawn). A usage
// without a cached-token count is no report: stock vLLM sends prompt_tokens_details only
// with --enable-prompt-tokens-details (and then omits it when nothing was cached), SGLang
// cached_tokens only with --enable-cache-report; so an absent count means 0 cached only from
// a backend that has sent one before (backend.Backend.ReportsCachedTokens).
func (s *Server) correctIndex(f *flow, res result) {
	b := f.lease.Backend()
	if res != resultOK || !f.ticket.Stands() || f.usagePrompt <= 0 || b == nil || f.dec.Backend != b {
		return
	}
	if f.usageCacheSeen {
		b.SetReportsCachedTokens()
	} else if !b.ReportsCachedTokens() {
		return
	}
	f.ticket.Report(f.usagePrompt, f.usageCached)
}
