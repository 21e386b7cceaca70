package router

import (
	"fmt"
	"strings"
)

// PolicyOptions are what the modes' constructors read; each mode takes its own section.
type PolicyOptions struct {
	// Prefix tunes mode prefix.
	Prefix PrefixOptions
}

// mode is one routing mode prefixlb offers: its name in the config and the metrics, and how
// its policy is built.
type mode struct {
	name      string
	newPolicy func(PolicyOptions) Policy
}

// DefaultMode is the mode of a config that names none: the prefix-aware policy.
const DefaultMode = "prefix"

// modes is the one table of modes, the default first. Config validation, the bench and the
// proxy's wiring all read it (ModeNames, NewPolicy).
var modes = [...]mode{
	{DefaultMode, func(o PolicyOptions) Policy { return NewPrefix(o.Prefix, nil) }},
	{"round-robin", func(PolicyOptions) Policy { return &RoundRobin{} }},
	{"least-load", func(PolicyOptions) Policy { return &LeastLoad{} }},
}

// ModeNames returns the names of the modes, the default first.
func ModeNames() []string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.name
	}
	return names
}

// NewPolicy returns a new policy of the named mode, built with o. The error names the modes
// there are.
func NewPolicy(name string, o PolicyOptions) (Policy, error) {
	for _, m := range modes {
		if m.name == name {
			return m.newPolicy(o), nil
		}
	}
	return nil, fmt.Errorf("unknown mode %q (one of %s)", name, strings.Join(ModeNames(), ", "))
}
