package health

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// Who else sends to a backend. Each successful scrape compares the requests the replica
// reports finished (the count of its end-to-end latency histogram,
// vllm:e2e_request_latency_seconds_count or sglang's, summed) with the generations this proxy
// finished there with a success status (backend.Completed), both since the previous scrape.
// Both count a request when its last token leaves, so per scrape they differ by the requests
// finishing during the scrape itself, and those differences cancel over time. The excess
// (theirs − ours) and ours are summed with exponential decay over about sendersTau scrapes; a
// replica whose decayed excess is above sendersSlack + sendersShare × the decayed ours has
// another sender (another prefixlb replica, another client) and is SendersShared until
// sendersHold after the last scrape that found so. Otherwise a replica whose counter was at
// zero when first seen (nobody had used it) is SendersAlone from that scrape on, and one
// already used is SendersAlone once this proxy has finished requests there (a decayed
// sendersMinOurs) and sendersSettle scrapes agree. A sender of under sendersShare of this
// proxy's requests there can go unseen.
//
// A replica that reports its running requests (a vLLM or SGLang dialect, so a finished count
// is expected) but no finished count yet has finished nothing: Prometheus clients that create
// a labelled series on its first observation (client_golang's vectors; llm-d-inference-sim)
// expose none before then. Such a replica counts as fresh (alone) until the count appears,
// and the count is then judged from zero at the first scrape without it; meanwhile more
// requests running and waiting there than this proxy has in flight (beyond sendersSlack) mean
// another sender. If this proxy has finished sendersMinOurs requests there and the count is
// still absent, the replica does not export one and stays unknown. A count that goes missing
// and comes back no lower carries on where it was.
//
// A fresh replica counts alone at once, so that a prefixlb running alone in front of fresh
// replicas spreads its first cold prompts by load rather than by the ring, which often puts
// two of the first conversations on one replica (bench compare, multi-turn). Unpeered
// prefixlb replicas that start together in front of fresh replicas then spread by their own
// loads until more than sendersSlack of the others' requests finish there, within a scrape
// or two; at equal loads the ring still decides, so their first placements agree.
const (
	// sendersTau is the decay of the sums, in scrapes (32 s at the default 1 s interval): a
	// second sender of a quarter of this proxy's rate is seen within about a minute, one of
	// as much within a scrape or two.
	sendersTau = 32
	// sendersSlack is the absolute decayed excess, in requests, that a lone replica may show:
	// requests that finished between the replica's count and this proxy's, and client aborts
	// that the replica counts.
	sendersSlack = 3
	// sendersShare is the excess relative to this proxy's own requests.
	sendersShare = 0.1
	// sendersSettle is how many scrapes must find no excess before a replica whose counter
	// was already above zero counts as alone.
	sendersSettle = 3
	// sendersMinOurs is how many of this proxy's requests (decayed) a replica must have
	// finished before it can count as alone.
	sendersMinOurs = 2
	// sendersHold is how long a replica seen shared stays shared without a new excess: a
	// second prefixlb replica that sends in bursts keeps the ring's coherence between bursts.
	sendersHold = time.Minute
)

// sendersJudge is one backend's comparison state; its scrape goroutine owns it.
type sendersJudge struct {
	have             bool    // prev* are set
	prevTheirs       float64 // the replica's finished-requests count at the last scrape
	prevOurs         uint64  // backend.Completed at the last scrape
	excess, ours     float64 // decayed sums since the counter was first seen or reset
	clean            int     // scrapes without excess since then
	sharedAt         time.Time
	startedUntouched bool // the first count seen was 0
	// absent: the replica speaks a known dialect and reports no finished count (yet), since
	// the scrape when backend.Completed was absentOurs; absentDone is what this proxy has
	// finished there since.
	absent     bool
	absentOurs uint64
	absentDone uint64
}

// senderSample is what one successful scrape tells the judge.
type senderSample struct {
	finished float64 // the replica's finished-requests count
	has      bool    // it reported one
	dialect  bool    // it reported its running requests: a missing count means none finished yet
	busy     float64 // running + waiting requests it reported
	ours     uint64  // backend.Completed
	inFlight int64   // this proxy's requests in flight there
}

// observe folds one scrape and returns the verdict at now.
func (j *sendersJudge) observe(now time.Time, s senderSample) backend.Senders {
	if !s.has {
		switch {
		case !s.dialect:
			*j = sendersJudge{sharedAt: j.sharedAt}
			return j.verdict(now)
		case !j.absent || s.ours < j.absentOurs:
			// The count is gone, or never was: the rest of the state is kept for a count
			// that comes back where it was (a scrape that missed it).
			j.absent, j.absentOurs, j.absentDone = true, s.ours, 0
		default:
			j.absentDone = s.ours - j.absentOurs
		}
		if !j.have && s.busy > float64(s.inFlight)+sendersSlack {
			// No count to compare, but more requests there than this proxy has in flight.
			j.sharedAt = now
		}
		return j.verdict(now)
	}
	if j.absent {
		if j.startsOver(s) && s.ours >= j.absentOurs {
			// The count appeared (a series created on first use) or came back lower (the
			// replica restarted meanwhile): it was 0 at the first scrape without it. That
			// replica was fresh if this proxy had not finished its own requests there since.
			*j = sendersJudge{sharedAt: j.sharedAt, have: true, prevOurs: j.absentOurs,
				startedUntouched: j.absentDone < sendersMinOurs}
		}
		j.absent, j.absentOurs, j.absentDone = false, 0, 0
	}
	if j.startsOver(s) {
		// The first count, or the replica restarted (its counter went back): start over.
		*j = sendersJudge{sharedAt: j.sharedAt, have: true, prevTheirs: s.finished, prevOurs: s.ours,
			startedUntouched: s.finished == 0}
		return j.verdict(now)
	}
	dt, do := s.finished-j.prevTheirs, float64(s.ours-j.prevOurs)
	j.prevTheirs, j.prevOurs = s.finished, s.ours
	const keep = 1 - 1.0/sendersTau
	j.excess = j.excess*keep + (dt - do)
	j.ours = j.ours*keep + do
	if j.excess > sendersSlack+sendersShare*j.ours {
		j.sharedAt = now
		j.clean = 0
	} else {
		j.clean++
	}
	return j.verdict(now)
}

// startsOver reports whether s's count is the first, or lower than the last (a restart).
func (j *sendersJudge) startsOver(s senderSample) bool {
	return !j.have || s.finished < j.prevTheirs || s.ours < j.prevOurs
}

func (j *sendersJudge) verdict(now time.Time) backend.Senders {
	switch {
	case !j.sharedAt.IsZero() && now.Sub(j.sharedAt) < sendersHold:
		return backend.SendersShared
	case j.absent && !j.have:
		if j.absentDone < sendersMinOurs {
			return backend.SendersAlone
		}
		return backend.SendersUnknown
	case !j.have:
		return backend.SendersUnknown
	case j.startedUntouched, j.ours >= sendersMinOurs && j.clean >= sendersSettle:
		return backend.SendersAlone
	}
	return backend.SendersUnknown
}
