package flowcontrol

// makeRoom makes room for it in a full queue by displacing one queued item, or refuses it
// (ErrFull or ErrBytesFull). The victim is the item its flow would serve last (the newest;
// the oldest once the flow is served newest first, Config.LIFOAfter) of the flow with the
// most queued items in the lowest band that has any, searching no higher than it's own band; in its own
// band, only a flow holding more items than it's flow would after the push, and never its
// own flow. So a flooding flow cannot keep a lighter one out by filling the queue first
// (longest-queue drop), and a full queue admits higher priorities ahead of lower ones.
// One displacement at most: when the victim's bytes do not make enough room, nothing is
// displaced and it is refused.
func (q *Queue) makeRoom(it *Item) error {
	refusal := ErrFull
	if q.count < q.cfg.MaxItems {
		refusal = ErrBytesFull
	}
	for i := len(q.bands) - 1; i >= 0; i-- {
		b := q.bands[i]
		if b.priority > it.Priority {
			break
		}
		if len(b.fat) == 0 {
			continue
		}
		fat := b.fat[0]
		if b.priority == it.Priority {
			own := 0
			if f := b.flows[it.Flow]; f != nil {
				if f == fat {
					return refusal
				}
				own = f.count
			}
			if fat.count <= own+1 {
				return refusal
			}
		}
		victim := fat.tail
		if h := fat.head; q.cfg.LIFOAfter > 0 && !h.Arrival.IsZero() && !it.Arrival.IsZero() && it.Arrival.Sub(h.Arrival) >= q.cfg.LIFOAfter {
			// A standing flow, served newest first (Config.LIFOAfter, its age taken at it's
			// arrival): its oldest is the one it would serve last, likely abandoned.
			victim = h
		}
		if q.count-1 >= q.cfg.MaxItems || q.bytes-victim.Bytes+max(it.Bytes, 0) > q.cfg.MaxBytes {
			return refusal
		}
		q.dequeue(victim)
		q.finish(victim, Displaced)
		return nil
	}
	return refusal
}
