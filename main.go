// Command prefixlb is a prefix-aware load balancer for OpenAI-compatible LLM servers.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/suite"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	// PREFIXLB_CPUPROFILE=FILE writes a CPU profile of the whole process to FILE (the overhead
	// harness sets it on the prefixlb processes it starts, to profile the proxy under load).
	if p := os.Getenv("PREFIXLB_CPUPROFILE"); p != "" {
		_ = os.Unsetenv("PREFIXLB_CPUPROFILE")
		if f, err := os.Create(p); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	root := &cobra.Command{
		Use:           "prefixlb",
		Short:         "Prefix-aware load balancer for vLLM/SGLang replicas",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	b := bench.Command()
	b.AddCommand(overhead.Command(), suite.Command())
	root.AddCommand(app.ServeCommand(), app.HashKeyCommand(), sim.Command(), b, versionCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prefixlb:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run: func(cmd *cobra.Command, _ []string) {
			v := version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			fmt.Fprintln(cmd.OutOrStdout(), "prefixlb", v)
		},
	}
}
