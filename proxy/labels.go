package proxy

import (
	"strings"
	"unicode/utf8"
)

// labelEscaper escapes a label value as the Prometheus text exposition format requires:
// backslash, double quote and line feed are the only escapes (\\, \", \n); every other byte
// is written raw. Go's %q is not that format (it writes \t, \x00, \u00e9, …, which a
// Prometheus parser rejects or reads as other characters).
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// labelValue returns s as a quoted label value for the text exposition format: valid UTF-8
// (invalid bytes become U+FFFD), escaped by labelEscaper, between double quotes.
func labelValue(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return `"` + labelEscaper.Replace(s) + `"`
}
