package steps

import "testing"

// RequestKey is the request's: the same method (any case), URL and body give one key
// whatever the headers; another body, URL, item or step gives another; and it is never
// the key of run, step and item alone.
func TestRequestKey(t *testing.T) {
	with := func(method, url string, body any) map[string]any {
		return map[string]any{"method": method, "url": url, "body": body, "headers": map[string]any{"Authorization": method + url}}
	}
	a := RequestKey("r", "transfer", 1, with("POST", "http://w/credit", map[string]any{"date": "2026-12-01", "cents": 5}))
	if b := RequestKey("r", "transfer", 1, with("post", "http://w/credit", map[string]any{"cents": 5, "date": "2026-12-01"})); b != a {
		t.Fatalf("the same request (method's case, key order, headers aside) has two keys: %s %s", a, b)
	}
	for name, other := range map[string]string{
		"another date":            RequestKey("r", "transfer", 1, with("POST", "http://w/credit", map[string]any{"date": "2026-12-02", "cents": 5})),
		"another url":             RequestKey("r", "transfer", 1, with("POST", "http://v/credit", map[string]any{"date": "2026-12-01", "cents": 5})),
		"another item":            RequestKey("r", "transfer", 2, with("POST", "http://w/credit", map[string]any{"date": "2026-12-01", "cents": 5})),
		"another step":            RequestKey("r", "refund", 1, with("POST", "http://w/credit", map[string]any{"date": "2026-12-01", "cents": 5})),
		"run, step and item only": IdempotencyKey("r", "transfer", 1),
	} {
		if other == a {
			t.Errorf("%s: the same key %s", name, a)
		}
	}
}
