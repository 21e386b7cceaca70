// Command prefixlb-overhead runs `overhead` with `serve` and `sim` beside it, so that the
// harness can start prefixlb as a child process of this same binary before the overhead
// command is mounted as `prefixlb bench overhead`:
//
//	go build -o /tmp/prefixlb-overhead ./bench/overhead/cmd/prefixlb-overhead
//	/tmp/prefixlb-overhead overhead
//
// With PREFIXLB_CPUPROFILE=FILE in its environment, a process of this binary writes a CPU
// profile of its whole life to FILE (overhead --cpuprofile-dir sets it for each prefixlb
// child, so that the proxy is profiled under the harness's load, apart from the load).
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/proxy"
)

func main() {
	if p := os.Getenv("PREFIXLB_CPUPROFILE"); p != "" {
		os.Unsetenv("PREFIXLB_CPUPROFILE")
		f, err := os.Create(p)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	root := &cobra.Command{Use: "prefixlb-overhead", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(overhead.Command(), proxy.ServeCommand(), sim.Command())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prefixlb-overhead:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
