package idemhttp

import (
	"errors"
	"fmt"
	"strings"
)

// maxKeyLength is the longest key accepted, in bytes (all keys are ASCII).
// It matches the key column of the key store and Stripe's documented limit.
const maxKeyLength = 255

var (
	// ErrKeyMissing means the request carried no Idempotency-Key header, or
	// only empty values of it: an empty field value holds no structured-field
	// Item (RFC 9651 section 4.2), so it is no key at all.
	ErrKeyMissing = errors.New("idemhttp: missing Idempotency-Key header")

	// ErrKeyMalformed means the Idempotency-Key header is present but unusable:
	// not a valid sf-string or bare key, a key that is empty (the sf-string
	// ""), longer than 255 characters or not printable ASCII, or more than
	// one key (a comma outside a quoted key, or two non-empty values). The wrapping
	// error says which, in words fit for a 400 response.
	ErrKeyMalformed = errors.New("idemhttp: malformed Idempotency-Key header")
)

// ParseKey extracts the idempotency key from the values of the
// Idempotency-Key header (http.Header.Values("Idempotency-Key")).
//
// Two forms are accepted, because clients send both:
//
//   - an RFC 9651 (formerly RFC 8941) structured-field String Item, as the
//     IETF draft specifies: "abc-123", where \" and \\ are the only escapes,
//     optionally followed by parameters (;name=value), which are checked for
//     syntax and otherwise ignored, as unknown parameters must be;
//   - a bare key, as Stripe's clients send it: abc-123, taken verbatim. It
//     must not start with a double quote (such a value is read as an
//     sf-string and must be a valid one) and may contain spaces, but not at
//     either end, and no comma.
//
// Optional whitespace (SP, HTAB) around the value is ignored. Either way the
// key must be 1 to 255 characters of printable ASCII (0x20-0x7E).
//
// A request that sends more than one non-empty value, or one value with a
// comma outside a quoted key, is refused as ambiguous: no key is guessed. A
// comma there makes a list ("a", "b"), or is how an intermediary merges two
// field lines into one (RFC 9110 section 5.3), which must not silently make
// another key. A key with a comma is sent quoted: "a,b". The error wraps
// ErrKeyMissing or ErrKeyMalformed.
func ParseKey(values []string) (string, error) {
	value, found := "", false
	for _, v := range values {
		v = trimOWS(v)
		if v == "" {
			continue
		}
		if found {
			return "", malformed("more than one Idempotency-Key header; send exactly one key")
		}
		value, found = v, true
	}
	if !found {
		return "", ErrKeyMissing
	}
	if value[0] == '"' {
		return parseStringKey(value)
	}
	return parseBareKey(value)
}

// FormatKey writes key as an RFC 9651 sf-string, the form the IETF draft
// specifies for the Idempotency-Key header: `abc-123` becomes `"abc-123"`, and
// '"' and '\' are escaped. ParseKey(FormatKey(k)) returns k for every valid
// key. Bytes outside printable ASCII are copied as they are, which makes a
// header that ParseKey refuses: an invalid key fails loudly at the server
// rather than being silently changed into another key.
func FormatKey(key string) string {
	escapes := strings.Count(key, `"`) + strings.Count(key, `\`)
	var b strings.Builder
	b.Grow(len(key) + escapes + 2)
	b.WriteByte('"')
	if escapes == 0 {
		b.WriteString(key)
	} else {
		for i := range len(key) {
			if c := key[i]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(key[i])
		}
	}
	b.WriteByte('"')
	return b.String()
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrKeyMalformed, fmt.Sprintf(format, args...))
}

func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// parseBareKey accepts value verbatim, unless it holds a comma. It returns
// a substring of value, so the common path does not allocate.
func parseBareKey(value string) (string, error) {
	if i := strings.IndexByte(value, ','); i >= 0 {
		return "", malformed("comma outside a quoted key at position %d: the value is a list of keys, "+
			"or two Idempotency-Key fields merged into one; send exactly one key (quote a key that holds a comma)", i)
	}
	if len(value) > maxKeyLength {
		return "", malformed("key is %d characters long, the limit is %d", len(value), maxKeyLength)
	}
	for i := range len(value) {
		if c := value[i]; c < 0x20 || c > 0x7e {
			return "", malformed("key contains byte 0x%02x at position %d; keys are printable ASCII", c, i)
		}
	}
	return value, nil
}

// parseStringKey parses value as an sf-string Item with optional
// parameters, and refuses a list of several members.
func parseStringKey(value string) (string, error) {
	p := sfParser{s: value}
	key, err := p.string()
	if err != nil {
		return "", err
	}
	if err := p.parameters(); err != nil {
		return "", err
	}
	if p.pos < len(p.s) {
		return "", p.trailing()
	}
	if key == "" {
		return "", malformed("key is empty")
	}
	if len(key) > maxKeyLength {
		return "", malformed("key is %d characters long, the limit is %d", len(key), maxKeyLength)
	}
	return key, nil
}
