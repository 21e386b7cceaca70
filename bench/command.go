// Package bench is `prefixlb bench`: it replays a workload through prefixlb in each routing
// mode against freshly started simulated replicas (or external backends, or an external
// proxy) and reports TTFT, inter-token latency, end-to-end latency, throughput, the backends'
// cached-token ratio and per-backend share, as a Markdown table, JSON and a TTFT CDF plot.
package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/peers"
	"github.com/prefixlb/prefixlb/router"
)

// Command returns `prefixlb bench` with its sub-commands compare and run.
func Command() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Load generator and routing-mode comparison",
		Long: `bench replays a workload (multi-turn, shared-prefix, agentic, mooncake, oasst, mt-bench) and measures
TTFT, inter-token latency, end-to-end latency, throughput, cached-token ratio and per-backend share.

  prefixlb bench compare                  # multi-turn, 4 simulated replicas, three modes, ~1 min
  prefixlb bench compare --workload mooncake --out results/mooncake
  prefixlb bench run --target http://127.0.0.1:19001 --label haproxy-rr`,
	}
	c.AddCommand(compareCommand(), runCommand())
	return c
}

func compareCommand() *cobra.Command {
	o := DefaultOptions()
	var modes, backends string
	c := &cobra.Command{
		Use:   "compare",
		Short: "Run the same workload through prefixlb in each mode on fresh replicas and compare",
		Long: `compare starts, for each mode, fresh simulated replicas (empty caches) and an in-process prefixlb
in that mode on an ephemeral 127.0.0.1 port, sends the workload (same seed each time), shuts
both down, and prints one side-by-side table. It writes DIR/report.json and DIR/ttft_cdf.png.

With --backends, a prefixlb is put in front of those replicas per mode instead (their caches are
not emptied). With --target, the workload goes straight to that endpoint (for example HAProxy,
which needs "option http-no-delay" for SSE) and its row is named by --label.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Modes = splitList(modes)
			o.Backends = splitList(backends)
			if err := finishFlags(cmd.Flags(), &o); err != nil {
				return err
			}
			return execute(cmd, o)
		},
	}
	fs := c.Flags()
	fs.StringVar(&modes, "modes", strings.Join(o.Modes, ","), "comma-separated modes to compare: prefixlb modes ("+strings.Join(router.ModeNames(), ", ")+") or bench-only peer policies ("+strings.Join(peers.Names(), ", ")+")")
	fs.StringVar(&backends, "backends", "", "comma-separated external backend URLs to put prefixlb in front of (instead of sims)")
	fs.StringVar(&o.Target, "target", "", "external endpoint to send to directly (e.g. an HAProxy); no prefixlb is started")
	fs.StringVar(&o.Label, "label", "", "row name for --target (default: the URL)")
	addCommon(fs, &o)
	return c
}

func runCommand() *cobra.Command {
	o := DefaultOptions()
	var mode, backends string
	c := &cobra.Command{
		Use:          "run",
		Short:        "Run a workload against one target (an external endpoint, or prefixlb in one mode)",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Modes = []string{mode}
			o.Backends = splitList(backends)
			if err := finishFlags(cmd.Flags(), &o); err != nil {
				return err
			}
			return execute(cmd, o)
		},
	}
	fs := c.Flags()
	fs.StringVar(&mode, "mode", "prefix", "prefixlb mode (ignored with --target)")
	fs.StringVar(&backends, "backends", "", "comma-separated external backend URLs (instead of sims)")
	fs.StringVar(&o.Target, "target", "", "external endpoint to send to directly")
	fs.StringVar(&o.Label, "label", "", "row name for --target (default: the URL)")
	addCommon(fs, &o)
	return c
}

func addCommon(fs *pflag.FlagSet, o *Options) {
	f := &o.Flags
	fs.StringVar(&o.Workload, "workload", o.Workload, "workload: "+strings.Join(Workloads, " | "))
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "simulated replicas to start (with --target: the replica count for the mooncake oracle)")
	fs.StringVar(&o.Out, "out", o.Out, "directory for report.json and ttft_cdf.png (empty: write nothing)")
	fs.Float64Var(&o.Speedup, "speedup", o.Speedup, "run the simulated replicas, think times and arrival gaps this many times faster than real time (sims only)")
	fs.Int64Var(&o.KVTokens, "kv-tokens", 0, fmt.Sprintf("KV-cache capacity of each simulated replica in tokens (default: the sim's; mooncake: %d)", MooncakeKVTokens))
	fs.StringVar(&o.ProxyConfig, "proxy-config", "", "prefixlb YAML whose settings the in-process proxy uses (mode, listen and backends are set by the bench)")
	fs.StringVar(&o.Model, "model", "", "model name in requests (default: the sim's; external: the target's first /v1/models id)")
	fs.BoolVar(&o.IgnoreEOS, "ignore-eos", o.IgnoreEOS, "send ignore_eos so every reply has exactly max_tokens tokens")
	fs.StringVar(&o.API, "api", "chat", "API of chat workloads: chat (/v1/chat/completions) | messages (/v1/messages, Anthropic's shape); completions workloads keep theirs")
	fs.BoolVarP(&o.Quiet, "quiet", "q", false, "no progress bar or per-mode lines on stderr")
	fs.BoolVar(&o.DumpRequests, "dump-requests", false, "also write every request's measurements to DIR/requests-<mode>.jsonl")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", 10*time.Minute, "bound on one request, stream included")
	fs.String("rates", "", "open-loop load sweep: run every mode at each of these comma-separated rates (shared-prefix: requests/s; oasst, mt-bench: conversations/s; mooncake: multiples of the trace's rate, i.e. --time-scale ÷ rate) or presets light, medium, saturation (0.5×, 1×, 2× the workload's base rate: shared-prefix 20, mooncake 1, oasst/mt-bench 1)")
	fs.IntVar(&o.RouterReplicas, "router-replicas", o.RouterReplicas, "independent prefixlb replicas (each its own index) per mode in front of the same replicas; requests go round-robin across them (label MODE×N)")
	fs.BoolVar(&o.Peering, "peering", o.Peering, "peer the --router-replicas prefix-mode replicas over 127.0.0.1 so they share learned prefixes and in-flight loads (label prefix×N+peer)")

	fs.Uint64Var(&f.Seed, "seed", 1, "workload seed (the same for every mode)")
	fs.IntVar(&f.Users, "users", 0, fmt.Sprintf("closed-loop users (multi-turn: %d; oasst, mt-bench: 4; shared-prefix: closed loop with this many users when --rate is not given)", DefaultUsers))
	fs.Float64Var(&f.Rate, "rate", 0, fmt.Sprintf("open-loop Poisson rate in requests (shared-prefix) or conversations (oasst, mt-bench) or sessions (agentic) per second (shared-prefix: 20; agentic: %g)", DefaultAgenticRate))
	fs.DurationVar(&f.ThinkMin, "think-min", 500*time.Millisecond, "think time before each turn, lower bound (multi-turn, oasst, mt-bench; agentic: bounds its lognormal think time, default 1s..1m around a 10 s median)")
	fs.DurationVar(&f.ThinkMax, "think-max", 2*time.Second, "think time before each turn, upper bound")
	fs.IntVar(&f.OutputTokens, "output-tokens", 0, "max_tokens per reply (multi-turn: 150; shared-prefix: 256; mt-bench, oasst's last turn: 256; agentic: the median, 200)")
	fs.IntVar(&f.Conversations, "conversations", 0, fmt.Sprintf("conversations (multi-turn: %d; oasst, mt-bench: all; agentic: top-level sessions, %d)", DefaultConversations, DefaultAgenticSessions))
	fs.IntVar(&f.Turns, "turns", 0, fmt.Sprintf("turns per conversation (multi-turn: %d; the public measurement used 10; agentic: median requests per session, %d, published 45)", DefaultTurns, DefaultAgenticRequests))
	fs.IntVar(&f.DocTokens, "doc-tokens", 0, fmt.Sprintf("document tokens per conversation (multi-turn: %d)", DefaultDocTokens))
	fs.IntVar(&f.QuestionTokens, "question-tokens", 0, "tokens per question (shared-prefix: 256; multi-turn follow-ups: 16 extra)")
	fs.IntVar(&f.Groups, "groups", 0, "shared-prefix groups (32)")
	fs.IntVar(&f.PromptsPerGroup, "prompts-per-group", 0, "shared-prefix prompts per group (32)")
	fs.IntVar(&f.SystemTokens, "system-tokens", 0, "shared-prefix system prompt tokens (2048); agentic: tools + system tokens per client version (17000)")
	fs.StringVar(&f.TracePath, "trace", "", "Mooncake trace JSONL (default: $PREFIXLB_SHARED or ../shared/traces/conversation_trace.jsonl)")
	fs.Float64Var(&f.TimeScale, "time-scale", 1, "mooncake: multiply the trace's arrival times (0.5 = twice the rate)")
	fs.StringVar(&f.Window, "window", "", "mooncake: start,duration of trace time to replay, in seconds or Go durations (e.g. 0,600)")
	fs.IntVar(&f.Count, "count", 0, fmt.Sprintf("mooncake: replay at most this many requests from the window start (default %d when no --window)", DefaultMooncakeCount))
	fs.IntVar(&f.MaxOutput, "max-output", 0, "cap on any reply's max_tokens (mooncake: none; oasst: 512; agentic: 1500)")
	fs.StringVar(&f.DatasetPath, "dataset", "", "oasst/mt-bench JSONL (default: $PREFIXLB_SHARED or ../shared/datasets/...)")
	fs.StringVar(&f.Load, "load", "", "overload: offered GPU work as a multiple of the replicas' capacity: overload (2, the default), light (0.5) or a number; fair10x[:S] instead runs the fairness mix (light at S of the capacity, default 0.6, heavy at 10x its rate)")
	fs.DurationVar(&f.Duration, "duration", 0, "overload: arrival window in model time (default 1m); the arm lasts until the last request finishes or expires")
	fs.StringSliceVar(&f.Tenants, "tenants", nil, "overload: run only these tenants (chat, noisy, batch; with fair10x: light, heavy), each at its own rate")
}

func finishFlags(fs *pflag.FlagSet, o *Options) error {
	if o.API != "chat" && o.API != loadgen.MessagesAPI {
		return fmt.Errorf("--api %q: want chat or %s", o.API, loadgen.MessagesAPI)
	}
	o.Flags.thinkSet = fs.Changed("think-min") || fs.Changed("think-max")
	if o.Flags.thinkSet {
		if !fs.Changed("think-min") {
			o.Flags.ThinkMin = 500 * time.Millisecond
		}
		if !fs.Changed("think-max") {
			o.Flags.ThinkMax = 2 * time.Second
		}
	}
	if o.Workload != "overload" {
		for _, n := range []string{"load", "duration", "tenants"} {
			if fs.Changed(n) {
				return fmt.Errorf("--%s is the overload workload's flag, not %s's", n, o.Workload)
			}
		}
	}
	spec, err := fs.GetString("rates")
	if err != nil {
		return err
	}
	o.Rates, err = ResolveRates(o.Workload, spec)
	return err
}

func execute(cmd *cobra.Command, o Options) error {
	o.Stdout, o.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err := Compare(ctx, o)
	return err
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
