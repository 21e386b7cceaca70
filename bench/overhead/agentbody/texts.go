package agentbody

import (
	"math/rand/v2"
	"strconv"

	"github.com/prefixlb/prefixlb/internal/splitmix"
)

// The texts of agent bodies: pseudo-prose (system prompt, task, assistant turns, tool
// descriptions) and pseudo-code (files read, edits, search hits), JSON-escaped as a client
// encodes them, so that a body holds what an agent's does: many \n, \t and \" escapes in tool
// results, and tool-call arguments that are JSON inside a JSON string (escaped twice).

var proseWords = []string{
	"the", "file", "function", "test", "error", "change", "package", "handler", "request",
	"cache", "prefix", "router", "replica", "config", "value", "returns", "should", "check",
	"implement", "refactor", "update", "fails", "passes", "because", "instead", "before",
	"after", "when", "which", "that", "this", "with", "from", "into", "and", "of", "to", "in",
	"is", "for", "on", "as", "by", "at", "we", "need", "let", "me", "look", "read", "run",
}

// prose appends words, with a sentence end now and then and a newline every few sentences,
// to dst until it is n bytes long.
func prose(rng *rand.Rand, dst []byte, n int) []byte {
	for i := 1; len(dst) < n; i++ {
		dst = append(dst, proseWords[rng.IntN(len(proseWords))]...)
		switch {
		case i%61 == 0:
			dst = append(dst, ".\n"...)
		case i%13 == 0:
			dst = append(dst, ". "...)
		default:
			dst = append(dst, ' ')
		}
	}
	return dst[:n]
}

var (
	codeDirs  = []string{"proxy", "router", "router/key", "router/index", "backend", "health", "configs", "internal/rawconn", "bench/sim", "app"}
	codeFiles = []string{"server", "flow", "admin", "prefix", "cost", "build", "scan", "render", "chunk", "index", "backend", "config", "options", "health"}
	codeLines = []string{
		`func (s *Server) handle(ctx *fasthttp.RequestCtx) {`,
		`if err != nil {`,
		`return fmt.Errorf("dial %s: %w", addr, err)`,
		`}`,
		`for i, b := range backends {`,
		`k.Chunks = append(k.Chunks, h)`,
		`// Pick returns the backend whose KV cache holds the longest prefix.`,
		`d := p.Pick(&k, candidates)`,
		`if len(body) > s.maxBody {`,
		`ctx.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)`,
		`log.Warn("request rejected", zap.String("reason", "body too large"), zap.Int("bytes", n))`,
		`t.Errorf("got %q, want %q", got, want)`,
		`case '"':`,
		`s := strings.TrimPrefix(u, "http://")`,
		`x := prime5 + 24 // under 32 bytes: no stripes`,
		`mu.Lock()`,
		`defer mu.Unlock()`,
		`return nil`,
		`var buf [64]byte`,
		`n := copy(dst, src[i:j])`,
		`if !ok || v.Type() != fastjson.TypeObject {`,
		`b.ReportAllocs()`,
		`want := []string{"match", "cold", "least-load"}`,
		`select {`,
		`case <-ctx.Done():`,
		`return ctx.Err()`,
		`default:`,
		`}`,
	}
	shellLines = []string{
		"ok  \tgithub.com/acme/app/router\t0.412s",
		"ok  \tgithub.com/acme/app/router/key\t1.903s",
		"--- FAIL: TestPickPrefersCachedBackend (0.00s)",
		"    prefix_test.go:118: got backend \"b\", want \"a\"",
		"FAIL\tgithub.com/acme/app/proxy\t2.117s",
		"?   \tgithub.com/acme/app/cmd\t[no test files]",
		"PASS",
		"=== RUN   TestBuild/chat_16KB",
		"drwxr-xr-x  2 dev dev  4096 Jan  3 10:12 testdata",
		"-rw-r--r--  1 dev dev 12877 Jan  3 10:12 build.go",
	}
)

// codeLine appends a line of pseudo-code at a random indent.
func codeLine(rng *rand.Rand, dst []byte) []byte {
	for range rng.IntN(4) {
		dst = append(dst, '\t')
	}
	return append(dst, codeLines[rng.IntN(len(codeLines))]...)
}

// path appends a source path.
func path(rng *rand.Rand, dst []byte) []byte {
	dst = append(dst, "/repo/"...)
	dst = append(dst, codeDirs[rng.IntN(len(codeDirs))]...)
	dst = append(dst, '/')
	dst = append(dst, codeFiles[rng.IntN(len(codeFiles))]...)
	return append(dst, ".go"...)
}

// appendJSONString appends s as a JSON string, quotes included.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendEscaped(dst, s)
	return append(dst, '"')
}

// appendEscaped appends s JSON-escaped, without quotes: \" \\ \n \t \r, other control bytes
// as \u00XX; everything else (UTF-8 included) as is, as JavaScript's JSON.stringify writes it.
func appendEscaped[T []byte | string](dst []byte, s T) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c < ' ':
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// A tool the agent calls, and how often (weights out of 100, the bench's assumption: file
// reads and shell commands dominate a coding session).
const (
	callRead = iota
	callBash
	callGrep
	callEdit
)

var callWeights = [...]int{callRead: 45, callBash: 25, callGrep: 15, callEdit: 15}

func pickCall(rng *rand.Rand) int {
	x := rng.IntN(100)
	for c, wt := range callWeights {
		if x < wt {
			return c
		}
		x -= wt
	}
	return callRead
}

// appendStep appends step k of about n bytes: `,{assistant turn with one tool call},{the
// tool's result}`. The result takes what the turn and the call leave of n (at least a line).
func appendStep(dst []byte, rng *rand.Rand, k, n int) []byte {
	start := len(dst)
	call := pickCall(rng)
	id := "call_" + strconv.FormatUint(splitmix.Next(uint64(k)^0xca11)&(1<<60-1), 36)

	// The arguments, as the model wrote them (JSON), then escaped into the body.
	var args, raw []byte
	switch call {
	case callRead:
		args = append(args, `{"file_path":"`...)
		args = path(rng, args)
		args = append(args, `","offset":`...)
		args = strconv.AppendInt(args, int64(1+rng.IntN(400)), 10)
		args = append(args, `,"limit":400}`...)
	case callBash:
		args = append(args, `{"command":"go test ./`...)
		args = append(args, codeDirs[rng.IntN(len(codeDirs))]...)
		args = append(args, `/... -run 'TestPick|TestBuild' -count=1","description":"Run the package tests"}`...)
	case callGrep:
		args = append(args, `{"pattern":"func \\(s \\*Server\\) [a-z]+\\(","path":"/repo","output_mode":"content","-n":true}`...)
	case callEdit:
		args = append(args, `{"file_path":"`...)
		args = path(rng, args)
		for _, f := range []string{`","old_string":"`, `","new_string":"`} {
			args = append(args, f...)
			raw = raw[:0]
			for l := range 3 + rng.IntN(6) {
				if l > 0 {
					raw = append(raw, '\n')
				}
				raw = codeLine(rng, raw)
			}
			args = appendEscaped(args, raw)
		}
		args = append(args, `"}`...)
	}

	dst = append(dst, `,{"role":"assistant","content":`...)
	dst = appendJSONString(dst, string(prose(rng, nil, 40+rng.IntN(200))))
	dst = append(dst, `,"tool_calls":[{"id":"`...)
	dst = append(dst, id...)
	dst = append(dst, `","type":"function","function":{"name":"`...)
	dst = append(dst, callNames[call]...)
	dst = append(dst, `","arguments":`...)
	dst = appendJSONString(dst, string(args))
	dst = append(dst, `}}]},{"role":"tool","tool_call_id":"`...)
	dst = append(dst, id...)
	dst = append(dst, `","content":"`...)
	if call == callEdit {
		dst = append(dst, "The file has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\\n"...)
	}
	// The result, line by line, until the step is n bytes long (the closing `"}` included);
	// one line at least.
	for line, first := 1+rng.IntN(300), true; first || len(dst)-start+len(`"}`) < n; line, first = line+1, false {
		raw = raw[:0]
		switch call {
		case callRead, callEdit:
			raw = appendLineNumber(raw, line)
			raw = codeLine(rng, raw)
		case callBash:
			raw = append(raw, shellLines[rng.IntN(len(shellLines))]...)
		case callGrep:
			raw = path(rng, raw)
			raw = append(raw, ':')
			raw = strconv.AppendInt(raw, int64(line), 10)
			raw = append(raw, ':')
			raw = codeLine(rng, raw)
		}
		raw = append(raw, '\n')
		dst = appendEscaped(dst, raw)
	}
	return append(dst, `"}`...)
}

var callNames = [...]string{callRead: "Read", callBash: "Bash", callGrep: "Grep", callEdit: "Edit"}

// appendLineNumber appends n right-aligned in 6 columns and a tab, as `cat -n` numbers lines
// (and a coding agent's file reads show them).
func appendLineNumber(dst []byte, n int) []byte {
	var num [20]byte
	s := strconv.AppendInt(num[:0], int64(n), 10)
	for range 6 - len(s) {
		dst = append(dst, ' ')
	}
	dst = append(dst, s...)
	return append(dst, '\t')
}

// A tool of the agent's tools list: its name and parameters (name, JSON Schema type). The
// names are those a coding agent such as Claude Code declares.
type toolDef struct {
	name   string
	params [][2]string
}

var toolDefs = []toolDef{
	{"Task", [][2]string{{"description", "string"}, {"prompt", "string"}, {"subagent_type", "string"}}},
	{"Bash", [][2]string{{"command", "string"}, {"description", "string"}, {"timeout", "number"}}},
	{"Glob", [][2]string{{"pattern", "string"}, {"path", "string"}}},
	{"Grep", [][2]string{{"pattern", "string"}, {"path", "string"}, {"glob", "string"}, {"output_mode", "string"}, {"-n", "boolean"}}},
	{"LS", [][2]string{{"path", "string"}, {"ignore", "array"}}},
	{"Read", [][2]string{{"file_path", "string"}, {"offset", "number"}, {"limit", "number"}}},
	{"Edit", [][2]string{{"file_path", "string"}, {"old_string", "string"}, {"new_string", "string"}, {"replace_all", "boolean"}}},
	{"MultiEdit", [][2]string{{"file_path", "string"}, {"edits", "array"}}},
	{"Write", [][2]string{{"file_path", "string"}, {"content", "string"}}},
	{"NotebookEdit", [][2]string{{"notebook_path", "string"}, {"cell_id", "string"}, {"new_source", "string"}}},
	{"WebFetch", [][2]string{{"url", "string"}, {"prompt", "string"}}},
	{"WebSearch", [][2]string{{"query", "string"}, {"allowed_domains", "array"}}},
	{"TodoWrite", [][2]string{{"todos", "array"}}},
	{"BashOutput", [][2]string{{"bash_id", "string"}, {"filter", "string"}}},
	{"KillShell", [][2]string{{"shell_id", "string"}}},
	{"ExitPlanMode", [][2]string{{"plan", "string"}}},
}

// paramDescBytes is the length of a parameter's description.
const paramDescBytes = 60

// toolsJSON renders the "tools" list (OpenAI function tools with JSON Schema parameters) of
// about n bytes: the tools' descriptions share what the structure and the parameters'
// descriptions leave.
func toolsJSON(rng *rand.Rand, n int) []byte {
	render := func(desc int) []byte {
		out := []byte{'['}
		for i, t := range toolDefs {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, `{"type":"function","function":{"name":"`...)
			out = append(out, t.name...)
			out = append(out, `","description":`...)
			out = appendJSONString(out, string(prose(rng, []byte(t.name+": "), len(t.name)+2+desc)))
			out = append(out, `,"parameters":{"type":"object","properties":{`...)
			for j, p := range t.params {
				if j > 0 {
					out = append(out, ',')
				}
				out = append(out, '"')
				out = append(out, p[0]...)
				out = append(out, `":{"type":"`...)
				out = append(out, p[1]...)
				out = append(out, `","description":`...)
				out = appendJSONString(out, string(prose(rng, nil, paramDescBytes)))
				out = append(out, '}')
			}
			out = append(out, `},"required":["`...)
			out = append(out, t.params[0][0]...)
			out = append(out, `"],"additionalProperties":false}}}`...)
		}
		return append(out, ']')
	}
	structure := len(render(0))
	return render(max(n-structure, 0) / len(toolDefs))
}
