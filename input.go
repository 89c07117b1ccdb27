// What the client sent, as a flow reads it: the request's fingerprint, its
// input decoded, and the params stored for a retry or the completer.

package idem

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/go-idem/idem/idemtype"
)

// prepared is a request's input in the forms the runner needs.
type prepared struct {
	input  any
	params []byte // JSON, stored with the key: what FlowConfig.Store keeps
	// fingerprints are the request's fingerprint under the current
	// fingerprint key, then under the earlier ones
	// (idemdriver.AcquireParams.Fingerprints); an input read back from its
	// key has the key's own.
	fingerprints [][]byte
	// fromKey: the input is the key's stored params (storedInput), not yet
	// decoded; input is nil.
	fromKey bool
}

// storedInput is a key's input as it was stored with it, for the completer:
// the stored params and the key's own fingerprint. The params are decoded
// once the key is held (execute), so that params that no longer decode are
// recorded on the key rather than skipped on every pass.
func storedInput(rec *idemtype.KeyRecord) *prepared {
	return &prepared{params: rec.Params, fingerprints: [][]byte{rec.Fingerprint}, fromKey: true}
}

// prepare accepts the input (req.Params) as In, *In, or JSON
// (json.RawMessage or []byte), and returns it decoded, fingerprinted, and as
// JSON to store (what FlowConfig.Store keeps of it). The fingerprint is
// taken over what the caller sent: req.Payload, else the JSON that
// req.Params is, else the JSON encoding of the input; under each of keys
// (see Config.fingerprintKeys).
func (f *Flow[In]) prepare(req *Request, keys [][]byte) (*prepared, error) {
	var in In
	payload := req.Payload
	switch p := req.Params.(type) {
	case In:
		in = p
	case *In:
		if p == nil {
			return nil, fmt.Errorf("%w: nil", ErrInvalidParams)
		}
		in = *p
	case json.RawMessage:
		v, err := f.decodeJSON(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
		}
		in = v
		if payload == nil {
			payload = p
		}
	case []byte:
		v, err := f.decodeJSON(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidParams, err)
		}
		in = v
		if payload == nil {
			payload = p
		}
	default:
		return nil, fmt.Errorf("%w: flow %q takes %T or JSON, got %T", ErrInvalidParams, f.name, in, req.Params)
	}
	js, err := encodeJSON(in)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrInvalidParams, err)
	}
	if containsEscapedNUL(js) {
		// Postgres stores neither jsonb nor text with a NUL in it, so this
		// input would fail at the store on every retry.
		return nil, fmt.Errorf(`%w: strings must not contain the NUL character (\u0000)`, ErrInvalidParams)
	}
	if payload == nil {
		payload = js
	}
	binary := req.PayloadBinary && req.Payload != nil
	fps, err := fingerprints(keys, f.name, req.Target, payload, binary) // an error wraps ErrInvalidParams
	if err != nil {
		return nil, err
	}
	p := &prepared{input: in, params: js, fingerprints: fps}
	if f.store != nil {
		if p.params, err = encodeJSON(f.store(in)); err != nil {
			return nil, fmt.Errorf("%w: encode what FlowConfig.Store keeps: %w", ErrInvalidParams, err)
		}
		if bytes.Equal(p.params, []byte("null")) {
			return nil, fmt.Errorf("%w: flow %q: FlowConfig.Store kept nothing (null) to store", ErrInvalidParams, f.name)
		}
	}
	return p, nil
}

// decodeJSON decodes one JSON value into an In. It is tolerant of the
// changes a deploy makes to In: a member In no longer has is ignored, a
// field In gained and the JSON lacks keeps its zero value.
func (f *Flow[In]) decodeJSON(data []byte) (In, error) {
	var in In
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("decode for flow %q: %w", f.name, err)
	}
	if dec.More() {
		return in, fmt.Errorf("flow %q: trailing data after the JSON value", f.name)
	}
	return in, nil
}

func (f *Flow[In]) decodeStored(stored []byte) (any, error) {
	in, err := f.decodeJSON(stored)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUndecodableParams, err)
	}
	return in, nil
}

// encodeJSON is json.Marshal without HTML escaping: json.Marshal writes each
// '<', '>' and '&' as a six-byte \u escape, which multiplied the size of an
// input full of them while it was fingerprinted and stored. The canonical
// form (and so the fingerprint) is the same either way.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// containsEscapedNUL reports whether a JSON document, as encoding/json
// writes it, holds a NUL character in a string. Backslashes appear only in
// string escapes there, so a scan of escapes is exact: "\\u0000" is text.
func containsEscapedNUL(doc []byte) bool {
	for i := 0; i+1 < len(doc); i++ {
		if doc[i] != '\\' {
			continue
		}
		if doc[i+1] == 'u' && i+5 < len(doc) && string(doc[i+2:i+6]) == "0000" {
			return true
		}
		i++ // skip the escaped character
	}
	return false
}
