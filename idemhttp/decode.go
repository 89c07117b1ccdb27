package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// decode reads the body, within the size limit, as exactly one JSON value
// of type In, or, for a form (Stripe profile), as the JSON formToJSON makes
// of it. It returns that JSON too: the key's fingerprint is taken over it,
// not over the decoded value.
func (h *Handler[In]) decode(w http.ResponseWriter, r *http.Request, form bool) (In, []byte, *Problem) {
	var in In
	body, p := h.readBody(w, r)
	if p != nil {
		return in, nil, p
	}
	if form {
		var err error
		if body, err = formToJSON(body, reflect.TypeFor[In]()); err != nil {
			return in, nil, h.problem(specMalformedForm, "The request body is not a valid form: "+
				strings.TrimPrefix(err.Error(), errMalformedForm.Error()+": ")+".")
		}
	}
	in, p = decodeBody[In](h, body)
	return in, body, p
}

// readBody reads the body within Config.MaxBodyBytes.
func (h *Handler[In]) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Problem) {
	limit := h.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, h.tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, h.tooLarge()
		}
		return nil, h.problem(specMalformedJSON, "The request body could not be read: "+err.Error()+".")
	}
	return body, nil
}

// decodeBody decodes body into an In, mapping each kind of failure to its
// problem: syntax to 400, a value that does not fit In to 422 naming the
// field.
func decodeBody[In any](h *Handler[In], body []byte) (In, *Problem) {
	var in In
	dec := json.NewDecoder(bytes.NewReader(body))
	if !h.cfg.AllowUnknownFields {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(&in)
	if err == nil {
		if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
			return in, h.problem(specMalformedJSON, fmt.Sprintf(
				"The request body holds more than one JSON value: unexpected data at byte %d.", len(body)-len(rest)))
		}
		if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
			return in, h.problem(specInvalidInput, "The request body is null; send a JSON "+jsonKind(reflect.TypeFor[In]())+".")
		}
		return in, nil
	}

	if errors.Is(err, io.EOF) {
		return in, h.problem(specMalformedJSON, "The request body is empty; send a JSON "+jsonKind(reflect.TypeFor[In]())+".")
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return in, h.problem(specMalformedJSON, "The request body ends in the middle of a JSON value.")
	}
	if syntaxErr, ok := errors.AsType[*json.SyntaxError](err); ok {
		return in, h.problem(specMalformedJSON, fmt.Sprintf("The request body is not valid JSON: %s (at byte %d).", syntaxErr.Error(), syntaxErr.Offset))
	}
	if typeErr, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		want := withArticle(jsonKind(typeErr.Type))
		if strings.HasPrefix(typeErr.Value, "number") {
			// A number that does not fit: a fraction or out of range.
			if r, ok := numberRange(typeErr.Type); ok {
				want = r
			}
		}
		if typeErr.Field == "" {
			return in, h.problem(specInvalidInput, fmt.Sprintf("The request body must be %s, not %s.", want, describeJSONValue(typeErr.Value)))
		}
		return in, h.invalidInput(FieldError{Field: clip(typeErr.Field), Detail: fmt.Sprintf("must be %s, not %s", want, describeJSONValue(typeErr.Value))})
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if unquoted, uerr := strconv.Unquote(name); uerr == nil {
			name = unquoted
		}
		p := h.invalidInput(FieldError{Field: clip(name), Detail: "is not a known field"})
		p.unknownField = true
		return in, p
	}
	// An UnmarshalJSON or UnmarshalText method of the input refused its
	// value (a malformed time, say); its message is all there is to say.
	return in, h.problem(specInvalidInput, "The request body is invalid: "+clip(strings.TrimPrefix(err.Error(), "json: "))+".")
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k == reflect.String:
		return "string"
	case k == reflect.Bool:
		return "boolean"
	case isInteger(k), k == reflect.Float32, k == reflect.Float64:
		return "number"
	case k == reflect.Slice, k == reflect.Array:
		return "array"
	case k == reflect.Struct, k == reflect.Map:
		return "object"
	}
	return "value"
}

// withArticle puts "a" or "an" before a JSON kind.
func withArticle(kind string) string {
	switch kind {
	case "object", "array":
		return "an " + kind
	}
	return "a " + kind
}

// numberRange says which numbers a Go number type holds, in words: "an
// integer from 0 to 255", "a number from -3.4028235e+38 to 3.4028235e+38".
func numberRange(t reflect.Type) (string, bool) {
	if t == nil {
		return "", false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k >= reflect.Int && k <= reflect.Int64:
		bits := uint(t.Bits())
		return fmt.Sprintf("an integer from %d to %d", int64(-1)<<(bits-1), int64(1)<<(bits-1)-1), true
	case isInteger(k): // unsigned
		return fmt.Sprintf("an integer from 0 to %d", uint64(1)<<(uint(t.Bits())-1)<<1-1), true
	case k == reflect.Float32:
		limit := strconv.FormatFloat(math.MaxFloat32, 'g', -1, 32)
		return "a number from -" + limit + " to " + limit, true
	case k == reflect.Float64:
		limit := strconv.FormatFloat(math.MaxFloat64, 'g', -1, 64)
		return "a number from -" + limit + " to " + limit, true
	}
	return "", false
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return false
}

// describeJSONValue turns encoding/json's description of a value ("string",
// "number 1.5", "array") into words.
func describeJSONValue(v string) string {
	switch {
	case v == "object" || v == "array":
		return "an " + v
	case v == "bool":
		return "a boolean"
	case strings.HasPrefix(v, "number "):
		return clip(strings.TrimPrefix(v, "number "))
	case v == "":
		return "this value"
	}
	return "a " + v
}
