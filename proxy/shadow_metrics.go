package proxy

import (
	"io"

	"github.com/VictoriaMetrics/metrics"
)

// writeShadow writes the shadow policy's totals (config shadow: prefix), read at scrape time:
//
//	prefixlb_shadow_decisions_total{agree="true|false"}            requests whose prefix choice was / was not the backend the mode chose
//	prefixlb_shadow_prefix_tokens_total{choice="shadow|actual"}     prompt tokens the prefix index says each choice's backend held
//	prefixlb_shadow_predicted_ttft_seconds_total{choice="shadow|actual"} the cost model's TTFT estimate for each choice, summed
//
// Nothing is written without a shadow.
func (s *Server) writeShadow(w io.Writer) {
	st, ok := s.decider.ShadowStats()
	if !ok {
		return
	}
	metrics.WriteCounterUint64(w, `prefixlb_shadow_decisions_total{agree="true"}`, st.Agree)
	metrics.WriteCounterUint64(w, `prefixlb_shadow_decisions_total{agree="false"}`, st.Disagree)
	metrics.WriteCounterUint64(w, `prefixlb_shadow_prefix_tokens_total{choice="shadow"}`, st.ShadowPrefixTokens)
	metrics.WriteCounterUint64(w, `prefixlb_shadow_prefix_tokens_total{choice="actual"}`, st.ActualPrefixTokens)
	metrics.WriteCounterFloat64(w, `prefixlb_shadow_predicted_ttft_seconds_total{choice="shadow"}`, st.ShadowPredictedTTFTSeconds)
	metrics.WriteCounterFloat64(w, `prefixlb_shadow_predicted_ttft_seconds_total{choice="actual"}`, st.ActualPredictedTTFTSeconds)
}
