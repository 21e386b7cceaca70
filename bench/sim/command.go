package sim

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Command returns the `prefixlb sim` command: N simulated vLLM replicas on consecutive ports,
// until SIGINT or SIGTERM. It prints one URL per line once they listen.
func Command() *cobra.Command {
	cfg := DefaultConfig()
	var (
		replicas int
		basePort int
		host     string
		zero     bool
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated vLLM replicas (continuous batching, prefix-cached KV, OpenAI API)",
		Long: `Run N simulated vLLM replicas in one process, on --host at ports --base-port, --base-port+1, ...
Each models an 8B model on one H100-class GPU by default: continuous batching with chunked
prefill, a finite KV cache of 16-token blocks with LRU prefix caching over the sim's own
tokenizer, max_num_seqs, streaming SSE with usage.prompt_tokens_details.cached_tokens and
vLLM-named Prometheus metrics. Every model constant is a flag; --speedup K runs K times faster.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if zero {
				return runZero(ctx, cmd.OutOrStdout(), cfg.Model, replicas, host, basePort)
			}
			c, err := StartCluster(cfg, replicas, host, basePort)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, u := range c.URLs() {
				fmt.Fprintln(out, u)
			}
			<-ctx.Done()
			return c.Close()
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&replicas, "replicas", 4, "number of replicas")
	fs.IntVar(&basePort, "base-port", 8000, "port of the first replica (0: ephemeral ports)")
	fs.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	fs.BoolVar(&zero, "zero-latency", false, "answer every completion at once (no engine; for measuring proxy overhead); only --model applies")
	cfg.RegisterFlags(fs)
	return cmd
}
