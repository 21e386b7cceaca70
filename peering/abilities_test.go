package peering

import (
	"reflect"
	"testing"

	"github.com/prefixlb/prefixlb/router"
)

// TestPolicyKeepsPrefixAbilities: the peered policy wraps the prefix policy, and the proxy
// finds a policy's abilities by type assertion (router.Abilities): it has every ability the
// prefix policy has, and settles besides.
func TestPolicyKeepsPrefixAbilities(t *testing.T) {
	pol, pre := reflect.TypeFor[*Policy](), reflect.TypeFor[*router.Prefix]()
	for _, a := range append(router.Abilities(), reflect.TypeFor[router.Policy]()) {
		if pre.Implements(a) && !pol.Implements(a) {
			t.Errorf("the prefix policy is a %s, the peered policy around it is not", a.Name())
		}
	}
	if !pol.Implements(reflect.TypeFor[router.Settler]()) {
		t.Error("the peered policy does not settle")
	}
}
