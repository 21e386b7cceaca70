package sim

import "github.com/prefixlb/prefixlb/internal/splitmix"

// The generated text: deterministic filler words, each exactly one sim token with or without
// its leading space (at most maxWordPiece-1 letters), chosen by a hash of the request and the
// token position.
var outputWordList = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as",
	"be", "at", "by", "this", "from", "or", "have", "an", "they", "which", "one", "you", "were",
	"all", "we", "when", "there", "can", "said", "each", "use", "do", "how", "their", "if",
	"will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her",
	"would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go",
	"see",
}

var (
	outputWords [len(outputWordList)][2]string // [word][leading space]
	outputIDs   [len(outputWordList)][2]uint32
)

func init() {
	for i, w := range outputWordList {
		outputWords[i] = [2]string{w, " " + w}
		outputIDs[i] = [2]uint32{tokenID(w), tokenID(" " + w)}
	}
}

// outputWordIndex mixes (seed, i) with splitmix64's finaliser.
func outputWordIndex(seed uint64, i int) int {
	z := splitmix.Next(seed + uint64(i)*0x9E3779B97F4A7C15) // the generator's (i+1)th output from seed
	return int(z % uint64(len(outputWordList)))
}
