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
	return fieldsChanged("health", reflect.ValueOf(old), reflect.ValueOf(nc))
}

// discoveryChanged names the discovery.* settings that differ between old and nc, in the
// struct's order: a section turned on or off by its name ("discovery.dns"), else its fields
// ("discovery.dns.port"); nil when none. Run starts discovery once, with the settings of the
// start, and the discovered backends are the running resolver's: a reload cannot apply them
// (that would mean stopping one resolver and starting another while its answers may still
// be on their way), so the controller warns with these names and keeps the running settings.
func discoveryChanged(old, nc configs.Discovery) []string {
	var out []string
	ov, nv := reflect.ValueOf(old), reflect.ValueOf(nc)
	t := ov.Type()
	for i := range t.NumField() {
		o, n := ov.Field(i), nv.Field(i) // each a section: a pointer to its struct, nil when off
		name := "discovery." + yamlName(t.Field(i))
		switch {
		case o.IsNil() && n.IsNil():
		case o.IsNil() || n.IsNil():
			out = append(out, name)
		default:
			out = append(out, fieldsChanged(name, o.Elem(), n.Elem())...)
		}
	}
	return out
}

// fieldsChanged names, as prefix.field, the fields of the structs old and nc that differ, in
// the struct's order; nil when none.
func fieldsChanged(prefix string, old, nc reflect.Value) []string {
	var out []string
	t := old.Type()
	for i := range t.NumField() {
		if reflect.DeepEqual(old.Field(i).Interface(), nc.Field(i).Interface()) {
			continue
		}
		out = append(out, prefix+"."+yamlName(t.Field(i)))
	}
	return out
}

// yamlName is f's name in the config file: its yaml tag's, else its Go name.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "" {
		name = f.Name
	}
	return name
}
