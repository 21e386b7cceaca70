// Memberlist's own log lines: counted when they report a rejected packet or stream, and
// rate-limited per kind, so that forged traffic at the peer port can neither flood the logs
// nor write its bytes into them.

package peering

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
)

const (
	// mlogInterval is the least time between two logged memberlist lines of one kind: one a
	// second; the lines in between are counted and the next logged one says how many
	// ("suppressed").
	mlogInterval = time.Second
	// mlogExcerpt is the most bytes of a memberlist line that are logged: enough for its
	// message and the sender's address, not for a forged payload echoed in it.
	mlogExcerpt = 120
	// mlogKindWords is how many leading words of a line name its kind ("Decrypt packet
	// failed", "UDP packet too").
	mlogKindWords = 3
	// mlogMaxKinds bounds the kinds tracked: memberlist's format strings are a few dozen; a
	// line of any further kind counts as mlogOtherKind.
	mlogMaxKinds  = 64
	mlogOtherKind = "other"
)

// rejectedMarks are the parts of memberlist's lines (v0.7.0, net.go; and nettransport.go's,
// in memberlist's words) that report a packet or stream refused: not decryptable (wrong
// secret or forged), not decodable, mislabelled, truncated, empty or oversized.
var rejectedMarks = []string{
	"Decrypt packet failed", "unacceptable label", "label header", "failed to receive",
	"Failed to receive", "Failed to read remote state", "packet too short", "invalid checksum",
	"missing message type", "not supported", "invalid msgType", "Failed to decode",
	"Remote node state size", "Failed push/pull merge", "Got ping for unexpected node",
	"truncated messages", "has been truncated", "cannot decode label", "Failed to decompress",
	"packet too large",
}

// levelWriter is memberlist's log output ("[LEVEL] memberlist: …" lines), and this
// package's own about the direct packets it refuses (emit). Each line reporting a rejected
// packet or stream counts in rejected; lines are logged at most one per kind per
// mlogInterval (warnings and errors at warn, the rest and every line once closing at debug),
// cut to mlogExcerpt printable ASCII bytes. It is safe for concurrent use.
type levelWriter struct {
	log      *zap.Logger
	rejected *metrics.Counter
	now      func() time.Time

	mu    sync.Mutex
	kinds map[string]*mlogKind

	// closing: the node is closing; memberlist's warnings are then logged at debug (its
	// probes fail on its own closed sockets: "use of closed network connection", "UDP
	// probes failed").
	closing atomic.Bool
}

type mlogKind struct {
	last       time.Time
	suppressed int
}

func newLevelWriter(lg *zap.Logger, rejected *metrics.Counter) *levelWriter {
	return &levelWriter{log: lg, rejected: rejected, now: time.Now, kinds: map[string]*mlogKind{}}
}

func (w *levelWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	warn := (strings.HasPrefix(line, "[WARN]") || strings.HasPrefix(line, "[ERR]")) && !w.closing.Load()
	msg := line
	if i := strings.Index(msg, "] "); strings.HasPrefix(msg, "[") && i > 0 {
		msg = msg[i+2:]
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	rejected := false
	for _, m := range rejectedMarks {
		if strings.Contains(msg, m) {
			rejected = true
			msg = redact(msg) // the sender chose what memberlist quotes (a label, a name)
			break
		}
	}
	w.emit("peering: memberlist", msg, warn, rejected)
	return len(p), nil
}

// emit logs msg (a line of memberlist's, or this package's own about a packet it refused)
// under message, at warn or debug, at most once per kind per mlogInterval, and counts it in
// rejected when it reports a refused packet or stream.
func (w *levelWriter) emit(message, msg string, warn, rejected bool) {
	if rejected {
		w.rejected.Inc()
	}
	ok, suppressed := w.allow(mlogKindOf(msg))
	if !ok {
		return
	}
	fields := []zap.Field{zap.String("line", sanitize(msg, mlogExcerpt))}
	if from := fromOf(msg); from != "" {
		// Logged on its own, so that a long line cut at mlogExcerpt still names the sender.
		fields = append(fields, zap.String("from", sanitize(from, mlogFromMax)))
	}
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed", suppressed))
	}
	if undecryptable(msg) {
		fields = append(fields, zap.String("hint", secretHint))
	}
	if warn {
		w.log.Warn(message, fields...)
	} else {
		w.log.Debug(message, fields...)
	}
}

// allow reports whether a line of kind may be logged now (at most one per kind per
// mlogInterval), and how many were suppressed since the last one logged.
func (w *levelWriter) allow(kind string) (bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.kinds[kind]
	if k == nil {
		if len(w.kinds) >= mlogMaxKinds {
			kind = mlogOtherKind
		}
		if k = w.kinds[kind]; k == nil {
			k = &mlogKind{}
			w.kinds[kind] = k
		}
	}
	now := w.now()
	if !k.last.IsZero() && now.Sub(k.last) < mlogInterval {
		k.suppressed++
		return false, 0
	}
	k.last = now
	suppressed := k.suppressed
	k.suppressed = 0
	return true, suppressed
}

// mlogFromMax bounds the logged sender address ("from=" of memberlist's lines): an IPv6
// address with a port and a zone fits.
const mlogFromMax = 64

// redact replaces what a rejected packet's line quotes ("…" or '…': memberlist echoes a
// forged label or node name with %q) by "…", so that a forger's text never reaches the log.
// An unterminated quote is redacted to the end of the line.
func redact(msg string) string {
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c != '"' && c != '\'' {
			sb.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(msg) && msg[j] != c {
			if msg[j] == '\\' {
				j++ // %q escapes the quote it would end on
			}
			j++
		}
		sb.WriteByte(c)
		sb.WriteString("…")
		if j < len(msg) {
			sb.WriteByte(c)
		}
		i = j
	}
	return sb.String()
}

// fromOf is the sender address a memberlist line names ("from=ADDR"), "" when none.
func fromOf(msg string) string {
	i := strings.LastIndex(msg, "from=")
	if i < 0 {
		return ""
	}
	f := msg[i+len("from="):]
	if j := strings.IndexAny(f, " \t"); j >= 0 {
		f = f[:j]
	}
	return f
}

// mlogKindOf is a line's first mlogKindWords words, letters only.
func mlogKindOf(msg string) string {
	words := strings.Fields(msg)
	var sb strings.Builder
	for i, wd := range words {
		if i == mlogKindWords {
			break
		}
		for _, r := range wd {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
				sb.WriteRune(r)
			}
		}
		sb.WriteByte(' ')
	}
	return sb.String()
}

// sanitize returns s cut to at most n bytes, each byte outside printable ASCII as '?'.
func sanitize(s string, n int) string {
	b := []byte(s)
	cut := len(b) > n
	if cut {
		b = b[:n]
	}
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	if cut {
		return string(b) + "…"
	}
	return string(b)
}
