package client_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test's node (engine, embedded NATS, API server) and every client is stopped by
// the end: no goroutine of theirs may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
