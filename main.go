// Command prefixlb is a prefix-aware load balancer for OpenAI-compatible LLM servers.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/proxy"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "prefixlb",
		Short:         "Prefix-aware load balancer for vLLM/SGLang replicas",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(proxy.ServeCommand(), sim.Command(), versionCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prefixlb:", err)
		os.Exit(1)
	}
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run: func(cmd *cobra.Command, _ []string) {
			v := version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" {
				v = bi.Main.Version
			}
			fmt.Fprintln(cmd.OutOrStdout(), "prefixlb", v)
		},
	}
}
