package key

// The tables of the prompt grammar (render.go), stated once for both renderers: the fastjson
// path (render_tree.go) reads a parse tree, the fast path (scan*.go) reads the body in place,
// and both look up here which fields of an object the key reads, in which order the header
// fields render, how each content-part type renders, and how a key begins (the seed) and ends
// (OK and PromptTokens); both emit the stream through the renderer's productions (render.go).
// What stays per path is how a value is reached: a *fastjson.Value in one, a position in the
// body in the other (see scan.go for the shapes the fast path hands back).

// topField names a top-level body field that the key reads; topOther is every other field.
// A duplicated field counts by its last occurrence (see Build).
type topField uint8

const (
	topOther topField = iota
	topModel
	topCacheSalt
	topStream
	topMessages       // chat
	topPrompt         // completions
	topInput          // Responses API
	topInstructions   // Responses API
	topTools          // header, chat and Responses API
	topFunctions      // header
	topResponseFormat // header
	topSystem         // Messages API
	topFieldCount     // the size of a table indexed by topField
)

func topFieldOf(name []byte) topField {
	switch string(name) {
	case "model":
		return topModel
	case "cache_salt":
		return topCacheSalt
	case "stream":
		return topStream
	case "messages":
		return topMessages
	case "prompt":
		return topPrompt
	case "input":
		return topInput
	case "instructions":
		return topInstructions
	case "tools":
		return topTools
	case "functions":
		return topFunctions
	case "response_format":
		return topResponseFormat
	case "system":
		return topSystem
	}
	return topOther
}

// headerFields are the top-level fields rendered before the messages, each as its tag and its
// canonical encoding, in this order, when present and not null.
var headerFields = [...]struct {
	tag   byte
	field topField
}{{tagTools, topTools}, {tagFunctions, topFunctions}, {tagRespFmt, topResponseFormat}}

// messageField names a field of a chat message (or of a Responses API message item).
type messageField uint8

const (
	messageOther messageField = iota
	messageRole
	messageName
	messageContent
	messageToolCalls
	messageToolCallID
	messageFunctionCall // the legacy single call
	messageFieldCount
)

func messageFieldOf(name []byte) messageField {
	switch string(name) {
	case "role":
		return messageRole
	case "name":
		return messageName
	case "content":
		return messageContent
	case "tool_calls":
		return messageToolCalls
	case "tool_call_id":
		return messageToolCallID
	case "function_call":
		return messageFunctionCall
	}
	return messageOther
}

// callFunctionField is the field of a tool_calls element that holds the function; an element
// without it (or with null) renders as tagCallOther and its canonical encoding.
const callFunctionField = "function"

// functionField names a field of a function object (tool_calls[].function, function_call).
type functionField uint8

const (
	functionOther functionField = iota
	functionName
	functionArguments
	functionFieldCount
)

func functionFieldOf(name []byte) functionField {
	switch string(name) {
	case "name":
		return functionName
	case "arguments":
		return functionArguments
	}
	return functionOther
}

// partField names a field of a content part that the key reads.
type partField uint8

const (
	partOther partField = iota
	partType
	partText
	partRefusal
	partImageURL
	partInputAudio
	partFile
	partVideoURL
	partAudioURL
	partFileID
	partFileData
	partFileURL
	partFieldCount
)

func partFieldOf(name []byte) partField {
	switch string(name) {
	case "type":
		return partType
	case "text":
		return partText
	case "refusal":
		return partRefusal
	case "image_url":
		return partImageURL
	case "input_audio":
		return partInputAudio
	case "file":
		return partFile
	case "video_url":
		return partVideoURL
	case "audio_url":
		return partAudioURL
	case "file_id":
		return partFileID
	case "file_data":
		return partFileData
	case "file_url":
		return partFileURL
	}
	return partOther
}

// mediaSource is one place where a media part's payload may be: the part's field, when it is
// a string, or else, when it is an object and sub is not empty, that object's string field
// sub (the last of duplicates).
type mediaSource struct {
	field partField
	sub   string
}

// partRule says how a content part of one type renders: a text part (text != partOther) as the
// string in its field text, a media part as its type and the xxhash64 of the first payload
// that its media sources yield, in order; with none, or for a type not in the table, as its
// type and the xxhash64 of the part's canonical encoding.
type partRule struct {
	text  partField
	media []mediaSource
}

// The media sources of each media part type (OpenAI chat, vLLM's video_url and audio_url, and
// the Responses API's input_image and input_file).
var (
	mediaImageURL   = []mediaSource{{partImageURL, "url"}}
	mediaVideoURL   = []mediaSource{{partVideoURL, "url"}}
	mediaAudioURL   = []mediaSource{{partAudioURL, "url"}}
	mediaInputAudio = []mediaSource{{partInputAudio, "data"}}
	mediaFile       = []mediaSource{{partFile, "file_data"}, {partFile, "file_id"}}
	mediaInputImage = []mediaSource{{partImageURL, ""}, {partFileID, ""}}
	mediaInputFile  = []mediaSource{{partFileData, ""}, {partFileID, ""}, {partFileURL, ""}}
)

// partRuleOf returns the rule for a content part whose "type" is typ (unescaped).
func partRuleOf(typ []byte) partRule {
	switch string(typ) {
	case "text", "input_text", "output_text":
		return partRule{text: partText}
	case "refusal":
		return partRule{text: partRefusal}
	case "image_url":
		return partRule{media: mediaImageURL}
	case "video_url":
		return partRule{media: mediaVideoURL}
	case "audio_url":
		return partRule{media: mediaAudioURL}
	case "input_audio":
		return partRule{media: mediaInputAudio}
	case "file":
		return partRule{media: mediaFile}
	case "input_image":
		return partRule{media: mediaInputImage}
	case "input_file":
		return partRule{media: mediaInputFile}
	}
	return partRule{}
}

// itemField names a field of a Responses API input item.
type itemField uint8

const (
	itemOther itemField = iota
	itemType
	itemRole
	itemName
	itemArguments
	itemCallID
	itemOutput
	itemFieldCount
)

func itemFieldOf(name []byte) itemField {
	switch string(name) {
	case "type":
		return itemType
	case "role":
		return itemRole
	case "name":
		return itemName
	case "arguments":
		return itemArguments
	case "call_id":
		return itemCallID
	case "output":
		return itemOutput
	}
	return itemOther
}

// Responses API input item types that render like chat; any other item renders as tagItem and
// its canonical encoding. An item with a role and no type is a message too.
const (
	itemMessage            = "message"
	itemFunctionCall       = "function_call"
	itemFunctionCallOutput = "function_call_output"
)

// begin is the head of every key: it seeds the chunker with the key-format version, the prompt
// kind, the model and the cache salt, points it at k, and points the renderer at it. Chunks
// are chunkTokens approximate tokens (the first two smaller; see HeadChunks).
func (s *state) begin(kind byte, model, salt []byte, chunkTokens int, k *Key) {
	r := &s.renderer
	r.out = &s.chunker
	s.chunker.start(chunkTokens*BytesPerToken, r.seed(kind, model, salt), k)
}

// finish is the tail of every key whose prompt rendered: k is OK and PromptTokens is the
// rendered length in approximate tokens, or the exact id count for a token-id prompt.
func (s *state) finish(kind byte, k *Key) {
	k.OK = true
	if kind == kindIDs {
		k.PromptTokens = s.chunker.written / tokenIDBytes
	} else {
		k.PromptTokens = s.chunker.written / BytesPerToken
	}
}

// tokenIDBytes is the rendered size of one token id (a little-endian uint32).
const tokenIDBytes = 4
