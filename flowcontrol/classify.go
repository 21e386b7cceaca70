package flowcontrol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Headers the classifier reads, in canonical form (http.Header's keys), so that an
// http.Header passed as Headers finds them without canonicalising each name again.
const (
	// HeaderPriority is prefixlb's integer priority header (trusted headers only).
	HeaderPriority = "X-Prefixlb-Priority"
	// HeaderFlow is prefixlb's flow header: the tenant a gateway charges the request to.
	HeaderFlow = "X-Prefixlb-Flow"
	// HeaderObjective is llm-d's x-llm-d-inference-objective: the name of an objective,
	// mapped to a priority by ClassifierConfig.Objectives.
	HeaderObjective = "X-Llm-D-Inference-Objective"
	// HeaderFairnessID is llm-d's x-llm-d-inference-fairness-id: the flow.
	HeaderFairnessID = "X-Llm-D-Inference-Fairness-Id"
	// HeaderAuthorization carries the API key as "Bearer KEY" (OpenAI clients).
	HeaderAuthorization = "Authorization"
	// HeaderAPIKey carries the API key alone (Anthropic clients).
	HeaderAPIKey = "X-Api-Key"
)

const (
	// MaxPriority bounds a priority, configured or read from a header: |p| ≤ MaxPriority.
	MaxPriority = 1000
	// MaxHeaderValue is the longest priority, objective or flow header value read, bytes; a
	// longer one is ignored as if absent (never truncated: a cut flow ID could merge two
	// tenants). Also the longest configured flow or objective name.
	MaxHeaderValue = 128
	// AnonymousFlow is the one flow of the requests that carry no API key and no flow from a
	// rule or a trusted header.
	AnonymousFlow = "anonymous"
	// Flow ID prefixes: a flow's ID says where it came from, and flows of different origins
	// never merge (a header cannot name a key's flow).
	keyFlowPrefix    = "key:"
	ruleFlowPrefix   = "rule:"
	headerFlowPrefix = "hdr:"
	// keyFlowBytes is how much of the key's SHA-256 a key's flow ID shows: 8 bytes, 16 hex
	// digits, the start of what `prefixlb hash-key` prints; enough that two keys of one
	// deployment never share a flow, far too little to tell the key.
	keyFlowBytes = 8
)

// Headers reads a request header by its canonical name; http.Header is one.
type Headers interface {
	Get(name string) string
}

// Request is what the classifier sees of a request: never its body.
type Request struct {
	// Path is the URL path (/v1/chat/completions).
	Path string
	// Model is the body's model field ("" when unknown).
	Model string
	// Headers are the request's headers (nil: none); the API key is read from
	// Authorization (Bearer) or, without one, X-Api-Key.
	Headers Headers
}

// Rule sets the priority and/or the flow of the requests it matches. Empty match fields
// match anything; a rule matches when all its non-empty ones do.
type Rule struct {
	// APIKeySHA256 is the hex SHA-256 of the API key (64 digits, `prefixlb hash-key`); the
	// key itself is never configured.
	APIKeySHA256 string
	// Model matches the body's model field exactly.
	Model string
	// Path matches the URL path exactly.
	Path string
	// Priority is the priority the rule sets (nil: not set, decided as without the rule).
	Priority *int
	// Flow is the flow the rule sets ("" not set); its ID is "rule:" + Flow.
	Flow string
}

// ClassifierConfig is the classification part of the flow_control section.
type ClassifierConfig struct {
	// DefaultPriority is the priority of a request no rule or trusted header sets.
	DefaultPriority int
	// Objectives maps an llm-d objective name (HeaderObjective) to a priority.
	Objectives map[string]int
	// Rules are tried in order; the first that matches wins.
	Rules []Rule
	// TrustedHeaders reads priority and flow from the headers above; off, they are ignored
	// (a client cannot raise its own priority).
	TrustedHeaders bool
}

// Source says what decided a priority or a flow (a metric label).
type Source uint8

const (
	SourceDefault   Source = iota // default_priority
	SourceRule                    // a rule
	SourceHeader                  // x-prefixlb-priority or x-prefixlb-flow
	SourceObjective               // x-llm-d-inference-objective
	SourceFairness                // x-llm-d-inference-fairness-id
	SourceKey                     // the API key's hash
	SourceAnonymous               // no key: the anonymous flow
)

// String is the source's metric label.
func (s Source) String() string {
	switch s {
	case SourceDefault:
		return "default"
	case SourceRule:
		return "rule"
	case SourceHeader:
		return "header"
	case SourceObjective:
		return "objective"
	case SourceFairness:
		return "fairness_id"
	case SourceKey:
		return "api_key"
	case SourceAnonymous:
		return "anonymous"
	}
	return "unknown"
}

// Ignored is a set of reasons a header was not used, for the caller to count.
type Ignored uint8

const (
	// IgnoredUntrusted: a priority, objective, flow or fairness header came with
	// trusted_headers off.
	IgnoredUntrusted Ignored = 1 << iota
	// IgnoredTooLong: a trusted header's value was over MaxHeaderValue bytes.
	IgnoredTooLong
	// IgnoredBadPriority: x-prefixlb-priority was not an integer within ±MaxPriority.
	IgnoredBadPriority
	// IgnoredUnknownObjective: x-llm-d-inference-objective named no configured objective.
	IgnoredUnknownObjective
)

// IgnoredReasons are the reasons in bit order, for a caller that counts each.
var IgnoredReasons = []Ignored{IgnoredUntrusted, IgnoredTooLong, IgnoredBadPriority, IgnoredUnknownObjective}

// String is a single reason's metric label.
func (i Ignored) String() string {
	switch i {
	case IgnoredUntrusted:
		return "untrusted"
	case IgnoredTooLong:
		return "too_long"
	case IgnoredBadPriority:
		return "bad_priority"
	case IgnoredUnknownObjective:
		return "unknown_objective"
	case 0:
		return "none"
	}
	return "several"
}

// Class is a request's classification.
type Class struct {
	Priority       int
	Flow           string
	PrioritySource Source
	FlowSource     Source
	// Ignored are the headers that were present and not used, and why.
	Ignored Ignored
}

// rule is a Rule compiled: the key's hash decoded, the flow's ID built once.
type rule struct {
	keyHash  [sha256.Size]byte
	hasKey   bool
	model    string
	path     string
	priority int
	setPrio  bool
	flow     string // flow ID; "" not set
}

// Classifier maps a request to its priority and flow (docs/flow-control.md,
// "Classification"). It is immutable and safe for concurrent use; a reload builds a new one.
// It never stores or logs an API key: a key is hashed once per request and only its hash
// is compared or, truncated, used as a flow ID.
type Classifier struct {
	defaultPriority int
	objectives      map[string]int
	rules           []rule
	trusted         bool
	needKey         bool // some rule matches on a key
}

// NewClassifier checks cfg and compiles it. An error names the field in the
// flow_control section's terms (rules[2].api_key_sha256) and never quotes a key hash field's
// value, which may be a key written there by mistake.
func NewClassifier(cfg ClassifierConfig) (*Classifier, error) {
	if err := checkPriority(cfg.DefaultPriority); err != nil {
		return nil, fmt.Errorf("default_priority: %w", err)
	}
	c := &Classifier{defaultPriority: cfg.DefaultPriority, trusted: cfg.TrustedHeaders, objectives: make(map[string]int, len(cfg.Objectives))}
	for name, p := range cfg.Objectives {
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("objectives: %w", err)
		}
		if err := checkPriority(p); err != nil {
			return nil, fmt.Errorf("objectives.%s: %w", name, err)
		}
		c.objectives[name] = p
	}
	for i, r := range cfg.Rules {
		cr := rule{model: r.Model, path: r.Path}
		if r.APIKeySHA256 != "" {
			if len(r.APIKeySHA256) != 2*sha256.Size {
				return nil, fmt.Errorf("rules[%d].api_key_sha256: %d characters, want the 64 hex digits of the key's SHA-256 (prefixlb hash-key prints them; the key itself never goes in the config)", i, len(r.APIKeySHA256))
			}
			if _, err := hex.Decode(cr.keyHash[:], []byte(r.APIKeySHA256)); err != nil {
				return nil, fmt.Errorf("rules[%d].api_key_sha256: not hex digits; want the key's SHA-256 as prefixlb hash-key prints it (the key itself never goes in the config)", i)
			}
			cr.hasKey, c.needKey = true, true
		}
		if r.Path != "" && r.Path[0] != '/' {
			return nil, fmt.Errorf("rules[%d].path: %q must start with /", i, r.Path)
		}
		if r.Priority != nil {
			if err := checkPriority(*r.Priority); err != nil {
				return nil, fmt.Errorf("rules[%d].priority: %w", i, err)
			}
			cr.priority, cr.setPrio = *r.Priority, true
		}
		if r.Flow != "" {
			if err := checkName(r.Flow); err != nil {
				return nil, fmt.Errorf("rules[%d].flow: %w", i, err)
			}
			cr.flow = ruleFlowPrefix + r.Flow
		}
		if !cr.setPrio && cr.flow == "" {
			return nil, fmt.Errorf("rules[%d]: sets neither priority nor flow", i)
		}
		c.rules = append(c.rules, cr)
	}
	return c, nil
}

func checkPriority(p int) error {
	if p < -MaxPriority || p > MaxPriority {
		return fmt.Errorf("%d is outside -%d..%d", p, MaxPriority, MaxPriority)
	}
	return nil
}

// checkName checks a configured flow or objective name: one a header could carry.
func checkName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty name")
	case len(s) > MaxHeaderValue:
		return fmt.Errorf("a name of %d bytes, over %d", len(s), MaxHeaderValue)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x21 || r == 0x7f }):
		return fmt.Errorf("%q holds a space or control character", s)
	}
	return nil
}

// Classify decides r's priority and flow.
//
//   - Priority: the first matching rule that sets one; else, with trusted headers, an
//     integer x-prefixlb-priority, else x-llm-d-inference-objective looked up in the
//     objectives (unknown: ignored); else the default priority.
//   - Flow: the first matching rule's flow; else, with trusted headers, x-prefixlb-flow,
//     else x-llm-d-inference-fairness-id; else the API key's flow ("key:" and the first 16
//     hex digits of its SHA-256); else the anonymous flow.
//
// "The first matching rule" is one rule: the attributes it leaves unset fall through to the
// headers and defaults, never to a later rule. A header over MaxHeaderValue bytes or not
// well formed is ignored as if absent, and reported in Class.Ignored. Allocations: none,
// but the flow ID of a key or of a header (one short string).
func (c *Classifier) Classify(r Request) Class {
	cl := Class{Priority: c.defaultPriority, PrioritySource: SourceDefault}
	var sum [sha256.Size]byte
	key := apiKey(r.Headers)
	if key != "" {
		sum = sha256.Sum256([]byte(key))
	}
	prioSet := false
	for i := range c.rules {
		ru := &c.rules[i]
		if ru.hasKey && (key == "" || ru.keyHash != sum) || ru.model != "" && ru.model != r.Model || ru.path != "" && ru.path != r.Path {
			continue
		}
		if ru.setPrio {
			cl.Priority, cl.PrioritySource, prioSet = ru.priority, SourceRule, true
		}
		if ru.flow != "" {
			cl.Flow, cl.FlowSource = ru.flow, SourceRule
		}
		break
	}
	if r.Headers != nil {
		c.fromHeaders(r.Headers, &cl, prioSet)
	}
	if cl.Flow == "" {
		if key != "" {
			cl.Flow, cl.FlowSource = keyFlow(&sum), SourceKey
		} else {
			cl.Flow, cl.FlowSource = AnonymousFlow, SourceAnonymous
		}
	}
	return cl
}

// fromHeaders fills what the rules left unset from trusted headers, or notes that
// untrusted ones were ignored.
func (c *Classifier) fromHeaders(h Headers, cl *Class, prioSet bool) {
	prio, obj, flow, fair := h.Get(HeaderPriority), h.Get(HeaderObjective), h.Get(HeaderFlow), h.Get(HeaderFairnessID)
	if !c.trusted {
		if prio != "" || obj != "" || flow != "" || fair != "" {
			cl.Ignored |= IgnoredUntrusted
		}
		return
	}
	bounded := func(v string) string {
		if len(v) > MaxHeaderValue {
			cl.Ignored |= IgnoredTooLong
			return ""
		}
		return v
	}
	prio, obj, flow, fair = bounded(prio), bounded(obj), bounded(flow), bounded(fair)
	if !prioSet {
		if p, ok := parsePriority(prio); ok {
			cl.Priority, cl.PrioritySource = p, SourceHeader
			prioSet = true
		} else if prio != "" {
			cl.Ignored |= IgnoredBadPriority
		}
	}
	if !prioSet && obj != "" {
		if p, ok := c.objectives[obj]; ok {
			cl.Priority, cl.PrioritySource = p, SourceObjective
		} else {
			cl.Ignored |= IgnoredUnknownObjective
		}
	}
	if cl.Flow == "" {
		switch {
		case flow != "":
			cl.Flow, cl.FlowSource = headerFlowPrefix+flow, SourceHeader
		case fair != "":
			cl.Flow, cl.FlowSource = headerFlowPrefix+fair, SourceFairness
		}
	}
}

// apiKey is the request's API key: Authorization's bearer token, else X-Api-Key, spaces
// around it trimmed; "" when neither.
func apiKey(h Headers) string {
	if h == nil {
		return ""
	}
	if a := h.Get(HeaderAuthorization); len(a) > len("bearer ") && strings.EqualFold(a[:len("bearer ")], "bearer ") {
		if k := strings.Trim(a[len("bearer "):], " \t"); k != "" {
			return k
		}
	}
	return strings.Trim(h.Get(HeaderAPIKey), " \t")
}

// keyFlow is the flow ID of a key whose SHA-256 is sum.
func keyFlow(sum *[sha256.Size]byte) string {
	var b [len(keyFlowPrefix) + 2*keyFlowBytes]byte
	copy(b[:], keyFlowPrefix)
	hex.Encode(b[len(keyFlowPrefix):], sum[:keyFlowBytes])
	return string(b[:])
}

// parsePriority reads an optionally signed decimal integer within ±MaxPriority, without
// allocating (strconv.Atoi allocates its error).
func parsePriority(s string) (int, bool) {
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" || len(s) > 7 { // 7 digits: no overflow, range checked below
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int(d)
	}
	if neg {
		n = -n
	}
	return n, checkPriority(n) == nil
}

// HashKey is the hex SHA-256 of an API key, as a rule's api_key_sha256 holds it; spaces and
// tabs around the key are trimmed, as Classify trims them from the header.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(strings.Trim(key, " \t")))
	return hex.EncodeToString(sum[:])
}
