package audit

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The requester is the header's account and user, one key; a header that names no user
// (or none at all) is nobody.
func TestRequester(t *testing.T) {
	for header, want := range map[string]string{
		`{"acc":"FLOW_USERS","user":"otto","rtt":1000}`: "FLOW_USERS/otto",
		`{"acc":"OTHER","user":"otto"}`:                 "OTHER/otto",
		`{"acc":"FLOW_USERS"}`:                          "",
		`not json`:                                      "",
		``:                                              "",
	} {
		if got := Requester(header); got != want {
			t.Errorf("Requester(%q) = %q, want %q", header, got, want)
		}
	}
}
