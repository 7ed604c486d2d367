package workflow

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestConcurrencyKeysLoadAndRender(t *testing.T) {
	src := "name: pay\nconcurrency:\n  - {key: \"acct-{{ inputs.account }}\", limit: 1}\n  - {key: \"{{ inputs.bank }}\", limit: 3}\n" + okSteps
	w, err := Load("pay.yaml", []byte(src), builtins)
	if err != nil {
		t.Fatal(err)
	}
	if w.Concurrency != 0 || len(w.ConcurrencyKeys) != 2 {
		t.Fatalf("concurrency %d, keys %+v", w.Concurrency, w.ConcurrencyKeys)
	}
	keys, err := w.Keys(map[string]any{"account": "42", "bank": "bca"})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != (KeyLimit{"acct-42", 1}) || keys[1] != (KeyLimit{"bca", 3}) {
		t.Fatalf("keys %+v", keys)
	}
	if _, err := w.Keys(map[string]any{"account": "42"}); err == nil || !strings.Contains(err.Error(), "bank") {
		t.Fatalf("a missing input: err %v; want it named", err)
	}
	if _, err := w.Keys(map[string]any{"account": strings.Repeat("x", 600), "bank": "b"}); err == nil {
		t.Fatal("a key of 600 bytes rendered")
	}
	// The single mapping and the plain number still load as before.
	one, err := Load("one.yaml", []byte("name: one\nconcurrency: {key: k, limit: 2}\n"+okSteps), builtins)
	if err != nil || len(one.ConcurrencyKeys) != 1 || one.ConcurrencyKeys[0].Limit != 2 {
		t.Fatalf("one key: %+v, %v", one, err)
	}
	n, err := Load("n.yaml", []byte("name: n\nconcurrency: 4\n"+okSteps), builtins)
	if err != nil || n.Concurrency != 4 || n.ConcurrencyKeys != nil {
		t.Fatalf("a number: %+v, %v", n, err)
	}
}

func TestStepConcurrencyLoadsAndRenders(t *testing.T) {
	src := `name: pay
inputs:
  account: {type: string}
steps:
  - name: collect
    uses: noop
  - name: transfer
    uses: noop
    needs: [collect]
    concurrency:
      - {key: "acct-{{ inputs.account }}", limit: 1}
      - {key: bank, limit: 4}
`
	w, err := Load("pay.yaml", []byte(src), builtins)
	if err != nil {
		t.Fatal(err)
	}
	st := w.Step("transfer")
	if len(st.Concurrency) != 2 || len(w.Step("collect").Concurrency) != 0 {
		t.Fatalf("keys %+v", st.Concurrency)
	}
	keys := st.Keys(map[string]any{"account": "42"})
	if len(keys) != 2 || keys[0] != (KeyLimit{"acct-42", 1}) || keys[1] != (KeyLimit{"bank", 4}) {
		t.Fatalf("keys %+v", keys)
	}
	// A key that does not render is counted under the template's unrendered key.
	if keys := st.Keys(nil); keys[0].Key != UnrenderedKey("acct-{{ inputs.account }}") {
		t.Fatalf("unrendered: %+v", keys)
	}
	// The keys survive the spec's JSON (the log's workflow entry).
	raw, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode(raw)
	if err != nil || len(back.Step("transfer").Concurrency) != 2 {
		t.Fatalf("decoded: %+v, %v", back, err)
	}
}
