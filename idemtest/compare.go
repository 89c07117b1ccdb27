package idemtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/go-idem/idem/idemtype"
)

// EqualStatusAndBody is the default Comparator: the statuses are equal and
// the bodies are equal byte for byte. Headers are not compared; they often
// carry per-request values such as a Location with a new id.
func EqualStatusAndBody(baseline, got *idemtype.Response) error {
	if err := equalStatus(baseline, got); err != nil {
		return err
	}
	if !bytes.Equal(baseline.Body, got.Body) {
		return fmt.Errorf("body %s, want %s", quoteBody(got.Body), quoteBody(baseline.Body))
	}
	return nil
}

// EqualJSON returns a Comparator for JSON bodies: the statuses are equal,
// and the bodies are equal as JSON values (so key order and whitespace do
// not matter) once every object member named in ignore is removed, at any
// depth. Ignore what each run generates afresh:
//
//	Compare: EqualJSON("ride_id", "charge_id"),
func EqualJSON(ignore ...string) Comparator {
	skip := make(map[string]bool, len(ignore))
	for _, name := range ignore {
		skip[name] = true
	}
	return func(baseline, got *idemtype.Response) error {
		if err := equalStatus(baseline, got); err != nil {
			return err
		}
		want, err := decodeWithout(baseline.Body, skip)
		if err != nil {
			return fmt.Errorf("the baseline body is not JSON: %w", err)
		}
		have, err := decodeWithout(got.Body, skip)
		if err != nil {
			return fmt.Errorf("body %s is not JSON: %w", quoteBody(got.Body), err)
		}
		if reflect.DeepEqual(want, have) {
			return nil
		}
		note := ""
		if len(ignore) > 0 {
			note = " (ignoring " + strings.Join(ignore, ", ") + ")"
		}
		return fmt.Errorf("body %s, want %s%s", marshal(have), marshal(want), note)
	}
}

func equalStatus(baseline, got *idemtype.Response) error {
	switch {
	case baseline == nil || got == nil:
		return fmt.Errorf("missing response (baseline %v, got %v)", baseline != nil, got != nil)
	case baseline.Status != got.Status:
		return fmt.Errorf("status %d, want %d; body %s", got.Status, baseline.Status, quoteBody(got.Body))
	}
	return nil
}

// decodeWithout decodes body keeping numbers exact, and drops the members
// named in skip from every object.
func decodeWithout(body []byte, skip map[string]bool) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return strip(v, skip), nil
}

func strip(v any, skip map[string]bool) any {
	switch t := v.(type) {
	case map[string]any:
		for name, member := range t {
			if skip[name] {
				delete(t, name)
				continue
			}
			t[name] = strip(member, skip)
		}
	case []any:
		for i := range t {
			t[i] = strip(t[i], skip)
		}
	}
	return v
}

func marshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// quoteBody shows a body in a failure message, cut to a readable length.
func quoteBody(body []byte) string {
	const max = 300
	if len(body) > max {
		return fmt.Sprintf("%q... (%d bytes)", body[:max], len(body))
	}
	return fmt.Sprintf("%q", body)
}
