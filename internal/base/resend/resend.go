package resend

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// The request headers of a try.
const (
	// HeaderNonce is a start's nonce: the hex the run ID was derived from.
	HeaderNonce = "Flow-Start-Nonce"
	// HeaderTry is the try's number, from 1; absent on a first try.
	HeaderTry = "Flow-Try"
)

// IDTimeLayout is the time prefix of a generated run ID, in UTC: the IDs sort by it.
const IDTimeLayout = "20060102-150405.000"

// suffixLen is the length of a generated ID's random part.
const suffixLen = 6

const digits = "0123456789abcdefghijklmnopqrstuvwxyz"

// nonceLen is the length of a nonce in hex (16 random bytes).
const nonceLen = 32

// NewNonce is a random nonce for one start.
func NewNonce() string {
	var b [nonceLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidNonce reports whether s has a nonce's shape (what a header brings is hostile).
func ValidNonce(s string) bool {
	if len(s) != nonceLen {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// RunIDFor is the run ID a start made at at with nonce gets: the time, then six
// characters of the nonce's hash.
func RunIDFor(at time.Time, nonce string) string {
	return at.UTC().Format(IDTimeLayout) + "-" + suffix(nonce)
}

// NewRunID is a generated run ID: the time, then six random characters.
func NewRunID(at time.Time) string {
	var b strings.Builder
	b.WriteString(at.UTC().Format(IDTimeLayout))
	b.WriteByte('-')
	for range suffixLen {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(digits))))
		b.WriteByte(digits[n.Int64()])
	}
	return b.String()
}

// Derived reports whether id is RunIDFor(some time, nonce).
func Derived(id, nonce string) bool {
	if !ValidNonce(nonce) {
		return false
	}
	prefix, rest, ok := strings.Cut(id, "-")
	if !ok {
		return false
	}
	stamp, sfx, ok := strings.Cut(rest, "-")
	if !ok || sfx != suffix(nonce) {
		return false
	}
	_, err := time.Parse(IDTimeLayout, prefix+"-"+stamp)
	return err == nil
}

func suffix(nonce string) string {
	sum := sha256.Sum256([]byte("flow-run-id\x00" + nonce))
	n := new(big.Int).SetBytes(sum[:8])
	s := n.Text(36)
	for len(s) < suffixLen {
		s = "0" + s
	}
	return s[len(s)-suffixLen:]
}

// Try is what a request's headers say of its try.
type Try struct {
	Nonce  string // the start's nonce ("" if none, or not a nonce's shape)
	Number int    // the try's number: 1 for the first (or when the header is absent)
}

// Resent reports whether the try is not the first.
func (t Try) Resent() bool { return t.Number > 1 }

// Parse reads a try from its headers' values: a header of the wrong shape counts as
// absent (a first try, no nonce), which only forgoes what it would have allowed.
func Parse(nonce, try string) Try {
	t := Try{Number: 1}
	if ValidNonce(nonce) {
		t.Nonce = nonce
	}
	if n, err := strconv.Atoi(try); err == nil && n > 1 && n < 1000 {
		t.Number = n
	}
	return t
}

type tryKey struct{}

// WithTry is ctx carrying t (the API server's, for the node's StartRun).
func WithTry(ctx context.Context, t Try) context.Context { return context.WithValue(ctx, tryKey{}, t) }

// TryOf is the try ctx carries: a first try without a nonce if none.
func TryOf(ctx context.Context) Try {
	if t, ok := ctx.Value(tryKey{}).(Try); ok {
		return t
	}
	return Try{Number: 1}
}
