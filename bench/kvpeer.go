package bench

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prefixlb/prefixlb/bench/peers"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/router/key"
)

// kvEventsOptions connects the dynamo-kv peer to cluster's replicas: their KV-event
// endpoints by URL, their block size, and their tokenizer and chat template (as a
// deployment's router uses the model's tokenizer). It waits, at most 5 s, until every
// replica's publisher has the peer's subscription, so that no event of the run is lost to
// ZMQ's slow joiner.
func kvEventsOptions(cluster *sim.Cluster) (*peers.KVEventsOptions, error) {
	if cluster == nil {
		return nil, fmt.Errorf("%s needs the simulated replicas (their KV events)", peers.DynamoKVName)
	}
	reps := cluster.Replicas()
	eps := cluster.KVEventEndpoints()
	if len(eps) != len(reps) {
		return nil, errors.New("the simulated replicas were started without KV events")
	}
	urls := cluster.URLs()
	o := &peers.KVEventsOptions{Endpoints: map[string]string{}, BlockSize: reps[0].Config().BlockSize}
	for i, u := range urls {
		o.Endpoints[u] = eps[i]
	}
	tok := reps[0]
	o.Tokenize = func(body []byte, api key.API) ([]uint32, error) {
		var toks []uint32
		var err error
		if api == key.APIMessages {
			toks, _, _, err = tok.ParseMessagesPrompt(body)
		} else {
			toks, _, _, err = tok.ParsePrompt(body, api == key.APIChat)
		}
		return toks, err
	}
	return o, nil
}

// waitKVSubscribed waits, at most 5 s, until every replica of cluster has a KV-event
// subscriber.
func waitKVSubscribed(cluster *sim.Cluster) error {
	for range 500 {
		all := true
		for _, r := range cluster.Replicas() {
			all = all && r.KVEventsSubscribed()
		}
		if all {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the replicas' KV-event publishers saw no subscription within 5 s")
}

// reportKVEvents writes one line on what the KV-event peer received and what the replicas
// dropped: an exact index is exact only while both are zero.
func reportKVEvents(w io.Writer, mode string, kv *peers.DynamoKV, cluster *sim.Cluster) {
	st := kv.Stats()
	var sent, dropped uint64
	if cluster != nil {
		for _, r := range cluster.Replicas() {
			_, s, d := r.KVEvents()
			sent, dropped = sent+s, dropped+d
		}
	}
	fmt.Fprintf(w, "%s: KV events: %d batches sent, %d dropped at the replicas; %d applied, %d missed, %d undecodable; blocks stored %d, removed %d, unknown parent %d, unknown removal %d\n",
		mode, sent, dropped, st.Batches, st.Missed, st.BadBatches, st.Index.Stored, st.Index.Removed,
		st.Index.UnknownParent, st.Index.UnknownRemoved)
}
