package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// MooncakeBlockTokens is the trace's block size: equal hash ids name equal 512-token blocks.
const MooncakeBlockTokens = 512

// TraceRow is one request of the Mooncake conversation trace.
type TraceRow struct {
	// Timestamp is the arrival time in milliseconds from the start of the trace.
	Timestamp    int64 `json:"timestamp"`
	InputLength  int   `json:"input_length"`
	OutputLength int   `json:"output_length"`
	HashIDs      []int `json:"hash_ids"`
}

// LoadMooncake reads a Mooncake JSONL trace.
func LoadMooncake(path string) ([]TraceRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []TraceRow
	br := bufio.NewReaderSize(f, 1<<16)
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if s := strings.TrimSpace(string(b)); s != "" {
			var r TraceRow
			if jerr := json.Unmarshal([]byte(s), &r); jerr != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, jerr)
			}
			if r.InputLength < 0 || r.OutputLength < 0 {
				return nil, fmt.Errorf("%s:%d: negative length", path, line)
			}
			rows = append(rows, r)
		}
		if err != nil {
			break
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return rows, nil
}

// MooncakeParams select and scale a part of the trace.
type MooncakeParams struct {
	// Start and Duration select rows by trace time (Duration 0: to the end).
	Start, Duration time.Duration
	// Count caps the number of rows after Start (0: no cap).
	Count int
	// TimeScale multiplies the trace's inter-arrival times (0.5 = twice the rate).
	TimeScale float64
	// MaxOutput caps output_length (0: no cap).
	MaxOutput int
	// Seed seeds the block text.
	Seed uint64
}

// Window returns the rows selected by p (arrival offsets not yet scaled).
func (p MooncakeParams) Window(rows []TraceRow) []TraceRow {
	startMs := p.Start.Milliseconds()
	endMs := int64(-1)
	if p.Duration > 0 {
		endMs = startMs + p.Duration.Milliseconds()
	}
	var out []TraceRow
	for _, r := range rows {
		if r.Timestamp < startMs || (endMs >= 0 && r.Timestamp >= endMs) {
			continue
		}
		if p.Count > 0 && len(out) >= p.Count {
			break
		}
		out = append(out, r)
	}
	return out
}

// BlockText is the synthesised text of one 512-token block: equal ids give equal text.
func BlockText(seed uint64, id int) string {
	return Words(Seed(seed, "mooncake-block", id), MooncakeBlockTokens)
}

// MooncakePrompt is a request's text: its blocks' texts concatenated, truncated to
// inputLength tokens (words).
func MooncakePrompt(seed uint64, r TraceRow) string {
	var sb strings.Builder
	sb.Grow(r.InputLength*4 + 8)
	words := 0
	for _, id := range r.HashIDs {
		if words >= r.InputLength {
			break
		}
		if words > 0 {
			sb.WriteByte(' ')
		}
		t := BlockText(seed, id)
		if left := r.InputLength - words; left < MooncakeBlockTokens {
			t = TruncateWords(t, left)
			words += left
		} else {
			words += MooncakeBlockTokens
		}
		sb.WriteString(t)
	}
	return sb.String()
}

// Mooncake builds the trace-replay workload: one single-turn request per selected row, sent
// open-loop at (timestamp - first timestamp) × TimeScale, with its synthesised prompt and
// max_tokens = output_length (at least 1). It uses the completions API: the trace's prefixes
// are token prefixes of one prompt, which a completions prompt keeps byte for byte (a chat
// message would put the whole text in one length-framed string).
func Mooncake(rows []TraceRow, p MooncakeParams) (*Workload, error) {
	if p.TimeScale <= 0 {
		p.TimeScale = 1
	}
	sel := p.Window(rows)
	if len(sel) == 0 {
		return nil, fmt.Errorf("mooncake: the window selects no requests")
	}
	t0 := sel[0].Timestamp
	convs := make([]*Conversation, len(sel))
	for i := range sel {
		r := sel[i]
		out := max(r.OutputLength, 1)
		if p.MaxOutput > 0 {
			out = min(out, p.MaxOutput)
		}
		seed := p.Seed
		convs[i] = &Conversation{ID: i,
			At:    time.Duration(float64(r.Timestamp-t0) * p.TimeScale * float64(time.Millisecond)),
			Turns: []Turn{{MaxTokens: out, UserFunc: func() string { return MooncakePrompt(seed, r) }}}}
	}
	return &Workload{Name: "mooncake", API: Completions, Loop: Open, Conversations: convs,
		Params: map[string]any{"requests": len(sel), "start_s": p.Start.Seconds(), "duration_s": p.Duration.Seconds(),
			"count": p.Count, "time_scale": p.TimeScale, "max_output": p.MaxOutput, "seed": p.Seed,
			"trace_span_s": float64(sel[len(sel)-1].Timestamp-t0) / 1000}}, nil
}
