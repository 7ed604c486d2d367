package clustertest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the binaries the tests built, and fails the run if a goroutine of the
// test process (a proxy's pump, a client's) outlived its test.
func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
