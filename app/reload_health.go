package app

import (
	"reflect"
	"strings"

	"github.com/prefixlb/prefixlb/configs"
)

// healthChanged names the health.* fields (by their YAML names, e.g. "health.interval") that
// differ between old and nc, in the struct's order; nil when none. The health checker is
// built once at start from its Options, so a reload cannot apply them: the controller warns
// with these names and keeps the running settings.
func healthChanged(old, nc configs.Health) []string {
	var out []string
	ov, nv := reflect.ValueOf(old), reflect.ValueOf(nc)
	t := ov.Type()
	for i := range t.NumField() {
		if reflect.DeepEqual(ov.Field(i).Interface(), nv.Field(i).Interface()) {
			continue
		}
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		out = append(out, "health."+name)
	}
	return out
}
