//go:build !linux

package steps

import "testing"

// modes: without the step init, only the process group.
func modes(*testing.T) []Mode { return []Mode{ModeProcessGroup} }
