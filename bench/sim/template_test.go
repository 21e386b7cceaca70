package sim

import (
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// media is the template's stand-in for a non-text part or block: <|media:HASH|> of its JSON.
func media(part string) string {
	return "<|media:" + strconv.FormatUint(xxhash.Sum64String(part), 16) + "|>"
}

// TestChatTemplate pins the chat template's text for chat and Messages API requests, and the
// client error (parameter and message) for each shape either API refuses.
func TestChatTemplate(t *testing.T) {
	const (
		image = `{"type":"image_url","image_url":{"url":"u"}}`
		block = `{"type":"image","source":{"data":"x"}}`
	)
	cases := []struct {
		name  string
		ep    endpoint
		body  string
		want  string
		param string // the error's parameter, when the request is refused
		msg   string
	}{
		{"chat", epChat, `{"tools":[{"type":"function","function":{"name":"Read"}}],"messages":[` +
			`{"role":"system","content":"S"},` +
			`{"role":"user","name":"bob","content":[{"type":"text","text":"look "},` + image + `]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"Read","arguments":"{\"p\":1}"}},{"function":{"name":"Ls","arguments":{"x":1}}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"done"},` +
			`{"role":"user","name":"n","tool_call_id":"i","content":""}]}`,
			"<|tools|>\n" + `[{"type":"function","function":{"name":"Read"}}]` + "<|end|>\n" +
				"<|system|>\nS<|end|>\n" +
				"<|user name=bob|>\nlook " + media(image) + "<|end|>\n" +
				"<|assistant|>\n<|tool_call|>Read {\"p\":1}\n<|tool_call|>Ls \n<|end|>\n" +
				"<|tool id=c1|>\ndone<|end|>\n" +
				"<|user name=n id=i|>\n<|end|>\n" +
				"<|assistant|>\n", "", ""},
		{"chat tool message without id", epChat, `{"messages":[{"role":"tool","content":"r"},{"role":"tool","tool_call_id":"","content":"s"}]}`,
			"<|tool|>\nr<|end|>\n<|tool|>\ns<|end|>\n<|assistant|>\n", "", ""},
		{"messages tool result without id", epMessages, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":"r"},{"type":"tool_result","tool_use_id":"","content":"s"}]}]}`,
			"<|tool id=|>\nr<|end|>\n<|tool id=|>\ns<|end|>\n<|assistant|>\n", "", ""},
		{"chat null tools", epChat, `{"tools":null,"messages":[{"role":"user","content":"hi"}]}`,
			"<|user|>\nhi<|end|>\n<|assistant|>\n", "", ""},
		{"chat tools not a list", epChat, `{"tools":{},"messages":[{"role":"user","content":"hi"}]}`, "", "tools", "tools must be a list"},
		{"chat no messages", epChat, `{}`, "", "messages", "messages must be a non-empty list"},
		{"chat empty messages", epChat, `{"messages":[]}`, "", "messages", "messages must be a non-empty list"},
		{"chat message not an object", epChat, `{"messages":[1]}`, "", "messages", "messages[0] must be an object"},
		{"chat no role", epChat, `{"messages":[{"role":"user","content":"x"},{"content":"x"}]}`, "", "messages", "messages[1].role must be a non-empty string"},
		{"chat part not an object", epChat, `{"messages":[{"role":"user","content":["x"]}]}`, "", "messages", "messages[0].content[0] must be an object"},
		{"chat text not a string", epChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":1}]}]}`, "", "messages", "messages[0].content[1].text must be a string"},
		{"chat part without type", epChat, `{"messages":[{"role":"user","content":[{"text":"x"}]}]}`, "", "messages", "messages[0].content[0].type is required"},
		{"chat content a number", epChat, `{"messages":[{"role":"user","content":1}]}`, "", "messages", "messages[0].content must be a string, a list of parts or null"},

		{"messages", epMessages, `{"tools":[{"name":"Read","description":"read \"it\" <now>","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}},{"name":"Ls"}],` +
			`"system":[{"type":"text","text":"S1"},{"type":"text","text":"S2"}],"messages":[` +
			`{"role":"user","content":"hi"},` +
			`{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"Read","input":{"p":1}},{"type":"tool_use","id":"t2","name":"Ls"}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"A"},` + block + `]},` +
			`{"type":"tool_result","tool_use_id":"t2","content":"B"},{"type":"tool_result","tool_use_id":"t3"},{"type":"text","text":"next"}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t4","content":null}]}]}`,
			"<|tools|>\n" + `[{"type":"function","function":{"name":"Read","description":"read \"it\" \u003cnow\u003e","parameters":{"type":"object"}}},` +
				`{"type":"function","function":{"name":"Ls","description":"","parameters":{}}}]` + "<|end|>\n" +
				"<|system|>\nS1S2<|end|>\n" +
				"<|user|>\nhi<|end|>\n" +
				"<|assistant|>\nok<|tool_call|>Read {\"p\":1}\n<|tool_call|>Ls {}\n<|end|>\n" +
				"<|tool id=t1|>\nA" + media(block) + "<|end|>\n" +
				"<|tool id=t2|>\nB<|end|>\n" +
				"<|tool id=t3|>\n<|end|>\n" +
				"<|user|>\nnext<|end|>\n" +
				"<|tool id=t4|>\n<|end|>\n" +
				"<|assistant|>\n", "", ""},
		{"messages system string", epMessages, `{"system":"S","messages":[{"role":"user","content":[` + block + `]}]}`,
			"<|system|>\nS<|end|>\n<|user|>\n" + media(block) + "<|end|>\n<|assistant|>\n", "", ""},
		{"messages tools not a list", epMessages, `{"tools":{},"messages":[{"role":"user","content":"hi"}]}`, "", "tools", "tools must be a list"},
		{"messages tool not an object", epMessages, `{"tools":[{"name":"a"},1],"messages":[{"role":"user","content":"hi"}]}`, "", "tools", "tools[1] must be an object"},
		{"messages system a number", epMessages, `{"system":1,"messages":[{"role":"user","content":"hi"}]}`, "", "system", "system must be a string or a list of blocks"},
		{"messages system block not an object", epMessages, `{"system":[1],"messages":[{"role":"user","content":"hi"}]}`, "", "system", "content blocks must be objects"},
		{"messages system text not a string", epMessages, `{"system":[{"type":"text"}],"messages":[{"role":"user","content":"hi"}]}`, "", "system", "a text block's text must be a string"},
		{"messages system block without type", epMessages, `{"system":[{"text":"x"}],"messages":[{"role":"user","content":"hi"}]}`, "", "system", "a content block's type is required"},
		{"messages no messages", epMessages, `{"system":"S"}`, "", "messages", "messages must be a non-empty list"},
		{"messages empty messages", epMessages, `{"messages":[]}`, "", "messages", "messages must be a non-empty list"},
		{"messages message not an object", epMessages, `{"messages":[{"role":"user","content":"x"},1]}`, "", "messages", "messages[1] must be an object"},
		{"messages bad role", epMessages, `{"messages":[{"role":"system","content":"x"}]}`, "", "messages", "messages[0].role must be user or assistant"},
		{"messages null content", epMessages, `{"messages":[{"role":"user","content":null}]}`, "", "messages", "messages[0].content must be a string or a list of blocks"},
		{"messages block not an object", epMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},1]}]}`, "", "messages", "messages[0].content[1] must be an object"},
		{"messages tool result content a number", epMessages, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":1}]}]}`, "", "messages", "messages must be a string or a list of blocks"},
		{"messages text not a string", epMessages, `{"messages":[{"role":"assistant","content":[{"type":"text","text":1}]}]}`, "", "messages", "a text block's text must be a string"},
		{"messages block without type", epMessages, `{"messages":[{"role":"user","content":[{"text":"x"}]}]}`, "", "messages", "a content block's type is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := fastjson.Parse(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			render := renderChat
			if tc.ep == epMessages {
				render = renderMessages
			}
			got, aerr := render([]byte("prefix:"), v)
			switch {
			case tc.msg != "":
				if aerr == nil || aerr.status != 400 || aerr.param != tc.param || aerr.msg != tc.msg {
					t.Fatalf("error %+v, want 400 %s: %q", aerr, tc.param, tc.msg)
				}
			case aerr != nil:
				t.Fatalf("error %+v", aerr)
			case string(got) != "prefix:"+tc.want:
				t.Errorf("got\n%q\nwant\n%q", got, "prefix:"+tc.want)
			}
		})
	}
}
