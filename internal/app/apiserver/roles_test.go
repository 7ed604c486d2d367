package apiserver

import (
	"slices"
	"sort"
	"testing"

	"github.com/flowrun/flow/client"
)

// Every operation the server answers has a role (so that `flowctl auth permissions`
// and --auth cover it), and every operation a role names is answered.
func TestEveryOperationHasARole(t *testing.T) {
	var ops []string
	for op := range (&Server{}).allHandlers() {
		ops = append(ops, op)
		if client.RoleFor(op) == "" {
			t.Errorf("operation %s has no role in client/roles.go", op)
		}
	}
	sort.Strings(ops)
	if !slices.Equal(ops, client.Operations()) {
		t.Errorf("the server answers %v; the roles name %v", ops, client.Operations())
	}
}
