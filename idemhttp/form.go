package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Bounds of a form body in Stripe's bracket notation: a request cannot make
// the decoder nest deeper, or allocate longer arrays, than a real API call
// needs.
const (
	formMaxDepth = 32
	formMaxIndex = 1000
)

// errMalformedForm is what formToJSON's errors wrap.
var errMalformedForm = errors.New("malformed form")

// formObject and formArray are the containers of a decoded form; a value
// is a string.
type (
	formObject map[string]any
	formArray  []any
)

// formToJSON decodes an application/x-www-form-urlencoded body written in
// Stripe's bracket notation, as the Stripe SDKs send it (card[number]=4242,
// items[0][price]=p_1, expand[]=customer), into the JSON of the same tree:
// objects for named brackets, arrays for indexed or empty ones, the values
// typed as t, the input type, reads them (a number or a boolean where t has
// one, a string otherwise). Members are written in sorted order, so the
// JSON, over which the key's fingerprint is taken, does not depend on the
// order of the form's fields; an array keeps its order.
//
// The arrays' slots are bounded by the body's length: a gapless form fills
// each slot from a field of its own, and each of its index segments takes
// at least two bytes ("[]"), so only a form with gaps, refused anyway,
// exceeds the bound; without it, short fields each indexing 999
// (a0[999]=x&a1[999]=x&...) would allocate 16 KB apiece.
func formToJSON(body []byte, t reflect.Type) ([]byte, error) {
	root := formObject{}
	slots := len(body)
	for pair := range strings.SplitSeq(string(body), "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			return nil, fmt.Errorf("%w: field name %q: %v", errMalformedForm, clip(rawKey), err)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, fmt.Errorf("%w: value of %s: %v", errMalformedForm, clip(key), err)
		}
		// JSON would write invalid UTF-8 as U+FFFD: two different names
		// or values would fingerprint the same, or make one member twice.
		if !utf8.ValidString(key) {
			return nil, fmt.Errorf("%w: field name %q is not UTF-8", errMalformedForm, clip(key))
		}
		if !utf8.ValidString(value) {
			return nil, fmt.Errorf("%w: value of %s is not UTF-8", errMalformedForm, clip(key))
		}
		path, err := formPath(key)
		if err != nil {
			return nil, err
		}
		if err := formSet(root, path, key, value, &slots); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	if err := writeFormJSON(&buf, root, t, ""); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// formPath splits a field name, name[a][0][], into its segments.
func formPath(key string) ([]string, error) {
	name, rest, _ := strings.Cut(key, "[")
	if name == "" {
		return nil, fmt.Errorf("%w: field name %q has no name before its brackets", errMalformedForm, clip(key))
	}
	path := []string{name}
	if rest == "" && !strings.Contains(key, "[") {
		return path, nil
	}
	rest = "[" + rest
	for rest != "" {
		if rest[0] != '[' {
			return nil, fmt.Errorf("%w: field name %q has text after its brackets", errMalformedForm, clip(key))
		}
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return nil, fmt.Errorf("%w: field name %q has an unclosed bracket", errMalformedForm, clip(key))
		}
		seg := rest[1:end]
		if strings.ContainsAny(seg, "[") {
			return nil, fmt.Errorf("%w: field name %q has a bracket inside a bracket", errMalformedForm, clip(key))
		}
		path = append(path, seg)
		if len(path) > formMaxDepth {
			return nil, fmt.Errorf("%w: field name %q nests deeper than %d", errMalformedForm, clip(key), formMaxDepth)
		}
		rest = rest[end+1:]
	}
	return path, nil
}

// formIndex reads an array index segment: digits, below formMaxIndex.
func formIndex(seg string) (int, bool) {
	if seg == "" || len(seg) > 4 || (len(seg) > 1 && seg[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(seg)
	if err != nil || n < 0 || n >= formMaxIndex {
		return 0, false
	}
	return n, true
}

// isIndexSegment says whether seg makes its container an array: empty
// (append) or digits.
func isIndexSegment(seg string) bool {
	if seg == "" {
		return true
	}
	for i := range len(seg) {
		if seg[i] < '0' || seg[i] > '9' {
			return false
		}
	}
	return true
}

// newFormContainer is the container a path continues in: an array for an
// index segment, an object otherwise.
func newFormContainer(next string) any {
	if isIndexSegment(next) {
		return formArray(nil)
	}
	return formObject{}
}

// formSet stores value at path under container, refusing a field given
// twice or given both a value and members, and an array slot beyond the
// *slots formToJSON still allows.
func formSet(root formObject, path []string, key, value string, slots *int) error {
	twice := func() error {
		return fmt.Errorf("%w: field %s is given twice, or both as a value and with members", errMalformedForm, clip(key))
	}
	// The container holding the current segment, and how to replace it
	// (an array grows by being replaced).
	var container any = root
	set := func(any) {}
	for i, seg := range path {
		last := i == len(path)-1
		switch c := container.(type) {
		case formObject:
			if isIndexSegment(seg) && i > 0 {
				return fmt.Errorf("%w: field %s mixes members and indexes", errMalformedForm, clip(key))
			}
			if last {
				if _, ok := c[seg]; ok {
					return twice()
				}
				c[seg] = value
				return nil
			}
			child, ok := c[seg]
			if !ok {
				child = newFormContainer(path[i+1])
				c[seg] = child
			}
			container, set = child, func(v any) { c[seg] = v }
		case formArray:
			if !isIndexSegment(seg) {
				return fmt.Errorf("%w: field %s mixes members and indexes", errMalformedForm, clip(key))
			}
			n := len(c)
			if seg != "" {
				var ok bool
				if n, ok = formIndex(seg); !ok {
					return fmt.Errorf("%w: field %s has an index that is not a number below %d", errMalformedForm, clip(key), formMaxIndex)
				}
			}
			if n >= len(c) {
				if len(c) >= formMaxIndex {
					return fmt.Errorf("%w: field %s has more than %d elements", errMalformedForm, clip(key), formMaxIndex)
				}
				if *slots -= n + 1 - len(c); *slots < 0 {
					return fmt.Errorf("%w: field %s leaves indexes out: they must run from 0 without gaps", errMalformedForm, clip(key))
				}
				c = append(c, make([]any, n+1-len(c))...)
				set(c)
			}
			if last {
				if c[n] != nil {
					return twice()
				}
				c[n] = value
				return nil
			}
			if c[n] == nil {
				c[n] = newFormContainer(path[i+1])
			}
			arr := c
			container, set = c[n], func(v any) { arr[n] = v }
		default: // a value where the path goes on
			return twice()
		}
	}
	return nil
}

// writeFormJSON writes v as JSON, its values typed as t reads them; at
// names the field, for errors.
func writeFormJSON(buf *bytes.Buffer, v any, t reflect.Type, at string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := v.(type) {
	case formObject:
		names := make([]string, 0, len(v))
		for name := range v {
			names = append(names, name)
		}
		slices.Sort(names)
		buf.WriteByte('{')
		for i, name := range names {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeJSONString(buf, name)
			buf.WriteByte(':')
			if err := writeFormJSON(buf, v[name], memberType(t, name), joinField(at, name)); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case formArray:
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		buf.WriteByte('[')
		for i, e := range v {
			if e == nil {
				return fmt.Errorf("%w: field %s[%d] is missing: indexes must run from 0 without gaps", errMalformedForm, clip(at), i)
			}
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeFormJSON(buf, e, elem, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		writeFormValue(buf, v, t)
	}
	return nil
}

func joinField(at, name string) string {
	if at == "" {
		return name
	}
	return at + "[" + name + "]"
}

// writeFormValue writes a form value as the JSON value t reads: a number
// or a boolean literal where t is one and the value spells one, a string
// otherwise (the decoder then names the field that does not fit).
func writeFormValue(buf *bytes.Buffer, v string, t reflect.Type) {
	if t != nil {
		switch k := t.Kind(); {
		case k == reflect.Bool && (v == "true" || v == "false"):
			buf.WriteString(v)
			return
		case isInteger(k) || k == reflect.Float32 || k == reflect.Float64:
			if json.Valid([]byte(v)) && v != "" && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
				buf.WriteString(v)
				return
			}
		}
	}
	writeJSONString(buf, v)
}

func writeJSONString(buf *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // a string always marshals
	buf.Write(b)
}

// memberType is the type of the member name of a struct or map type t, as
// encoding/json matches it (the json tag's name, else the field's, case
// insensitively); nil when t has none.
func memberType(t reflect.Type, name string) reflect.Type {
	if t == nil {
		return nil
	}
	switch t.Kind() {
	case reflect.Map:
		return t.Elem()
	case reflect.Struct:
	default:
		return nil
	}
	var fold reflect.Type
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		jsonName, _, _ := strings.Cut(tag, ",")
		if jsonName == "" {
			if f.Anonymous {
				if ft := memberType(derefType(f.Type), name); ft != nil {
					return ft
				}
				continue
			}
			jsonName = f.Name
		}
		if jsonName == name {
			return f.Type
		}
		if fold == nil && strings.EqualFold(jsonName, name) {
			fold = f.Type
		}
	}
	return fold
}

func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
