package ident

import (
	"strings"
	"testing"
)

func TestNamesAndIDs(t *testing.T) {
	for s, want := range map[string]bool{"a": true, "run-1.x_z": true, "a:b": false, "A9": true, "": false, "-a": false,
		"a/b": false, "a b": false, strings.Repeat("a", 128): true, strings.Repeat("a", 129): false} {
		if ValidID(s) != want {
			t.Errorf("ValidID(%q) = %v", s, !want)
		}
	}
	for s, want := range map[string]bool{"collect": true, "step_2-b": true, "9x": true, "": false, "_a": false,
		"Collect": false, "a.b": false, strings.Repeat("a", 64): true, strings.Repeat("a", 65): false} {
		if ValidName(s) != want {
			t.Errorf("ValidName(%q) = %v", s, !want)
		}
	}
}
