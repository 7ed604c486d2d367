package client

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// A user's inbox prefix is one subject token, the same for the same user, and never
// another user's: names that only look alike ("ann.smith", "ann_2Esmith") stay apart,
// and no prefix is a prefix-token of another's.
func TestInboxPrefix(t *testing.T) {
	for user, want := range map[string]string{
		"":            "_INBOX",
		"otto":        "_INBOX_otto",
		"ann.smith":   "_INBOX_ann_2Esmith",
		"ann_2Esmith": "_INBOX_ann_5F2Esmith",
		"a>b*c d":     "_INBOX_a_3Eb_2Ac_20d",
		"UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4": "_INBOX_UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4",
		"jürgen": "_INBOX_j_C3_BCrgen",
	} {
		got := InboxPrefix(user)
		if got != want {
			t.Errorf("InboxPrefix(%q) = %q, want %q", user, got, want)
		}
		if strings.ContainsAny(got, ".*> \t") {
			t.Errorf("InboxPrefix(%q) = %q is not one subject token", user, got)
		}
		if err := nats.CustomInboxPrefix(got)(&nats.Options{}); err != nil {
			t.Errorf("nats.go refuses %q: %v", got, err)
		}
	}
	seen := map[string]string{}
	for _, user := range []string{"ann", "ann.smith", "ann_2Esmith", "ann_", "ann-", "Ann", "ann smith", "ann_20smith"} {
		p := InboxPrefix(user)
		if other, ok := seen[p]; ok {
			t.Errorf("%q and %q share the inbox %s", user, other, p)
		}
		seen[p] = user
	}
}

// Dial's inbox is the user its credentials name: a user and password, the URL's user,
// an nkey's public key, a credentials file's user key; none for a token or nobody; and
// a prefix the caller chose wins.
func TestInboxForTheCredentials(t *testing.T) {
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"UCREDSUSER","name":"carl"}`))
	jwt := "eyJhbGciOiJlZDI1NTE5In0." + claims + ".c2ln"
	for what, c := range map[string]struct {
		url  string
		opts []nats.Option
		want string
	}{
		"user and password": {"nats://h:4222", []nats.Option{nats.UserInfo("otto", "pw")}, "_INBOX_otto"},
		"the URL's user":    {"nats://vera:pw@h:4222,nats://h2:4222", nil, "_INBOX_vera"},
		"a token":           {"nats://t0ken@h:4222", nil, "_INBOX"},
		"nobody":            {"nats://h:4222", nil, "_INBOX"},
		"an nkey":           {"nats://h:4222", []nats.Option{nats.Nkey("UNKEYUSER", func([]byte) ([]byte, error) { return nil, nil })}, "_INBOX_UNKEYUSER"},
		"a JWT":             {"nats://h:4222", []nats.Option{nats.UserJWT(func() (string, error) { return jwt, nil }, func([]byte) ([]byte, error) { return nil, nil })}, "_INBOX_UCREDSUSER"},
	} {
		got, ok := inboxFor(c.url, c.opts)
		if !ok || got != c.want {
			t.Errorf("%s: %q %v, want %q", what, got, ok, c.want)
		}
	}
	if _, ok := inboxFor("nats://h:4222", []nats.Option{nats.UserInfo("otto", "pw"), nats.CustomInboxPrefix("_MINE")}); ok {
		t.Error("a prefix the caller chose was overridden")
	}
}
