package steplog

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Mask is what stands for a secret in logs and outputs.
const Mask = "***"

// MinSecret is the shortest value masked: a shorter one would mask every occurrence of
// a letter or two in everything a step prints, and is no secret.
const MinSecret = 3

// Masker replaces a run's secret values (its inputs declared `secret: true`) with Mask.
// A nil Masker masks nothing.
type Masker struct {
	r *strings.Replacer
}

// NewMasker masks each of values that is at least MinSecret long once written as text
// (a string as it is, any other value as JSON), and each of its lines.
func NewMasker(values []any) *Masker {
	var secrets []string
	add := func(s string) {
		if len(s) >= MinSecret && !slices.Contains(secrets, s) {
			secrets = append(secrets, s)
		}
	}
	for _, v := range values {
		s, ok := v.(string)
		if !ok {
			b, err := json.Marshal(v)
			if err != nil {
				s = fmt.Sprint(v)
			} else {
				s = string(b)
			}
		}
		add(s)
		for _, l := range strings.Split(s, "\n") {
			add(strings.TrimSuffix(l, "\r"))
		}
	}
	if len(secrets) == 0 {
		return nil
	}
	// Longest first: a secret that contains another is masked whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(secrets))
	for _, s := range secrets {
		pairs = append(pairs, s, Mask)
	}
	return &Masker{r: strings.NewReplacer(pairs...)}
}

// String is s with the secrets masked.
func (m *Masker) String(s string) string {
	if m == nil {
		return s
	}
	return m.r.Replace(s)
}

// JSON is a JSON document with the secrets masked in every string, keys too; it stays
// valid JSON. A document that is not JSON is returned as it is.
func (m *Masker) JSON(doc json.RawMessage) json.RawMessage {
	if m == nil || len(doc) == 0 {
		return doc
	}
	var v any
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return doc
	}
	changed := false
	v = m.value(v, &changed)
	if !changed {
		return doc // as the step wrote it
	}
	out, err := json.Marshal(v)
	if err != nil {
		return doc
	}
	return out
}

func (m *Masker) value(v any, changed *bool) any {
	switch v := v.(type) {
	case string:
		s := m.String(v)
		*changed = *changed || s != v
		return s
	case json.Number:
		if s := m.String(v.String()); s != v.String() {
			*changed = true
			return s
		}
		return v
	case []any:
		for i := range v {
			v[i] = m.value(v[i], changed)
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			mk := m.String(k)
			*changed = *changed || mk != k
			out[mk] = m.value(x, changed)
		}
		return out
	}
	return v
}
