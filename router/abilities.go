package router

import (
	"reflect"
	"slices"
)

// abilities are the optional interfaces a Policy may implement beside Pick and Preview, each
// declared beside what it serves (policy.go, correct.go, fleet.go, shadow.go).
var abilities = [...]reflect.Type{
	reflect.TypeFor[BackendSetter](),
	reflect.TypeFor[ModelsWatcher](),
	reflect.TypeFor[Learner](),
	reflect.TypeFor[Tracker](),
	reflect.TypeFor[Settler](),
	reflect.TypeFor[Corrector](),
	reflect.TypeFor[Repicker](),
	reflect.TypeFor[IndexHolder](),
	reflect.TypeFor[Explainer](),
	reflect.TypeFor[ShadowReporter](),
}

// Abilities returns the optional interfaces a Policy may implement beside Pick and Preview.
// A policy that wraps another (Decider, Shadow, peering.Policy) must expose every ability of
// what it wraps, or the proxy, which finds abilities by type assertion, silently loses it
// (the http.ResponseWriter/Flusher trap): the wrapper tests check each wrapper against this
// list, and a test checks that the list names every interface the package declares.
func Abilities() []reflect.Type { return slices.Clone(abilities[:]) }
