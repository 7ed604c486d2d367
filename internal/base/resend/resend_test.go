package resend

import (
	"context"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/flowrun/flow/internal/base/ident"
)

// An ID derived from a nonce is a valid run ID of a generated ID's shape, Derived of
// that nonce and of no other; a try's headers of the wrong shape count as absent.
func TestDerivedIDs(t *testing.T) {
	at := time.Date(2026, 12, 3, 7, 0, 0, 123e6, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		nonce, other := NewNonce(), NewNonce()
		id := RunIDFor(at.Add(time.Duration(rapid.Int64Range(0, int64(365*24*time.Hour)).Draw(t, "d"))), nonce)
		if !ident.ValidID(id) || len(id) != len(NewRunID(at)) || !strings.HasPrefix(id, "20") {
			t.Fatalf("%q is not a generated ID's shape (%q)", id, NewRunID(at))
		}
		if !Derived(id, nonce) {
			t.Fatalf("%q is not derived from its own nonce", id)
		}
		if Derived(id, other) && suffix(other) != suffix(nonce) {
			t.Fatalf("%q derived from another nonce", id)
		}
	})
	nonce := NewNonce()
	for _, bad := range []struct{ id, nonce string }{
		{"given-1", nonce},
		{RunIDFor(at, nonce), ""},
		{RunIDFor(at, nonce), strings.ToUpper(nonce) + "x"},
		{"2026120x-070000.123-" + suffix(nonce), nonce},
		{RunIDFor(at, nonce) + "-x", nonce},
	} {
		if Derived(bad.id, bad.nonce) {
			t.Errorf("Derived(%q, %q) = true", bad.id, bad.nonce)
		}
	}
	for _, c := range []struct {
		nonce, try string
		want       Try
	}{
		{nonce, "", Try{Nonce: nonce, Number: 1}},
		{nonce, "2", Try{Nonce: nonce, Number: 2}},
		{"short", "x", Try{Number: 1}},
		{"", "-3", Try{Number: 1}},
		{"", "1000000", Try{Number: 1}},
	} {
		if got := Parse(c.nonce, c.try); got != c.want {
			t.Errorf("Parse(%q, %q) = %+v, want %+v", c.nonce, c.try, got, c.want)
		}
	}
	if TryOf(context.Background()).Resent() || !TryOf(WithTry(context.Background(), Try{Number: 3})).Resent() {
		t.Error("TryOf")
	}
}
