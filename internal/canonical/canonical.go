// Package canonical writes the canonical form of a JSON document (RFC 8785
// style), so that two documents that mean the same thing have the same bytes
// and therefore the same request fingerprint (the runner's fingerprint of
// what a client sent, its only user):
//
//   - no insignificant whitespace;
//   - object members sorted by the UTF-16 code units of their names, as RFC
//     8785 §3.2.3 requires; array order is kept;
//   - strings written with the fewest escapes: only '"', '\' and the control
//     characters U+0000-U+001F are escaped (\b \t \n \f \r, otherwise \u00xx),
//     everything else is literal UTF-8, so "\u00e9" and "é" are the same;
//   - numbers by their exact decimal value.
//
// Numbers deliberately deviate from RFC 8785, which rounds every number to an
// IEEE 754 double and would make 12345678901234567890 and 12345678901234567000
// the same request. That is unacceptable for amounts of money, so the literal
// is instead reduced to sign, significant digits and exponent, and that exact
// value is laid out the way ECMAScript's Number::toString lays out a double:
// 1, 1.0, 1e0, 10e-1 and 0.1e1 all become 1; -0 becomes 0; 1e21 becomes
// 1e+21; 0.0000001 becomes 1e-7. For every number that is the shortest
// round-trip form of a double, the result is byte for byte what RFC 8785
// produces.
//
// It reads what a lenient decoder (Go's encoding/json) accepts, mapped to
// one canonical form, so that every request a server decoded has a
// fingerprint: duplicate member names are kept, in their input order after
// sorting (the decoder's last one wins, and this order says which is last);
// invalid UTF-8 and escaped surrogates that do not form a pair become
// U+FFFD, as encoding/json decodes them; nesting may be as deep as
// encoding/json allows (10000). Refused, with an error wrapping
// [ErrInvalidJSON]: anything that is not exactly one JSON value (RFC 8259),
// member names of one object that differ only in case (which the decoder
// also reads as one field: the sorted order could not say which came last),
// and numbers whose normalised exponent exceeds ±1,000,000.
package canonical

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON is wrapped by every error for a document that is refused;
// the wrapping message says what is wrong and at which byte offset.
var ErrInvalidJSON = errors.New("invalid JSON")

const (
	// maxDepth bounds nesting so that a hostile body cannot exhaust the
	// stack of the recursive scanner: encoding/json's own bound, so that
	// every document it decodes has a canonical form.
	maxDepth = 10000

	// maxExponent bounds the decimal exponent of a number after
	// normalisation (the e in d.ddde±X). Numbers are kept exact, never
	// expanded into digits beyond their own length, so this is not about
	// memory; it keeps exponent arithmetic far from int overflow and refuses
	// values that no real request carries.
	maxExponent = 1_000_000

	// poolMaxBuffer is the largest buffer returned to the pool, so that
	// one huge document does not pin its memory for the life of the process.
	poolMaxBuffer = 1 << 20
)

// JSON returns the canonical form of doc (see the package documentation) in
// a slice of its own.
func JSON(doc []byte) ([]byte, error) {
	c := get(doc)
	defer put(c)

	if err := c.canonicalize(); err != nil {
		return nil, err
	}
	out := make([]byte, len(c.out))
	copy(out, c.out)
	return out, nil
}

// Append appends the canonical form of doc to dst and returns the extended
// buffer, like the strconv Append functions. It writes straight into dst, so
// a caller that keeps dst in a pool of its own canonicalises without
// allocating or copying. On error it returns dst unchanged.
func Append(dst, doc []byte) ([]byte, error) {
	c := get(doc)
	own := c.out
	c.out = dst
	err := c.canonicalize()
	out := c.out
	c.out = own // the pool keeps its own buffer, never the caller's
	put(c)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// memberRef is one member of the object being canonicalised: where its
// unescaped name sits in canonicalizer.names, where its `"name":value` bytes
// sit in canonicalizer.out, and where it started in the input, for errors.
type memberRef struct {
	nameStart, nameEnd int
	outStart, outEnd   int
	inOffset           int
}

// canonicalizer is a single-pass recursive descent scanner that writes the
// canonical form as it reads. Objects are written in input order and then
// rearranged in place once their members are known. All of its buffers are
// reused across calls through pool, so a call allocates only its result.
type canonicalizer struct {
	in  []byte
	pos int
	out []byte

	// members and names are stacks shared by all open objects: an object
	// uses the entries from the length it found on entry and truncates back
	// when it closes.
	members []memberRef
	names   []byte

	// scratch holds an object's member bytes while they are copied back in
	// sorted order.
	scratch []byte
}

var pool = sync.Pool{New: func() any { return new(canonicalizer) }}

func get(doc []byte) *canonicalizer {
	c := pool.Get().(*canonicalizer) //nolint:forcetypeassert // the pool only holds *canonicalizer
	c.in = doc
	c.pos = 0
	c.out = c.out[:0]
	c.members = c.members[:0]
	c.names = c.names[:0]
	c.scratch = c.scratch[:0]
	return c
}

func put(c *canonicalizer) {
	if cap(c.out) > poolMaxBuffer || cap(c.names) > poolMaxBuffer ||
		cap(c.scratch) > poolMaxBuffer || cap(c.members) > poolMaxBuffer/64 {
		return
	}
	c.in = nil // do not keep the caller's document alive
	pool.Put(c)
}

// canonicalize appends the canonical form of c.in to c.out.
func (c *canonicalizer) canonicalize() error {
	c.skipWhitespace()
	if err := c.value(0); err != nil {
		return err
	}
	c.skipWhitespace()
	if c.pos < len(c.in) {
		return c.errorf("unexpected %s after the top-level value", c.describe())
	}
	return nil
}

func (c *canonicalizer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, fmt.Sprintf(format, args...), c.pos)
}

// describe names the byte at c.pos for error messages.
func (c *canonicalizer) describe() string {
	if c.pos >= len(c.in) {
		return "end of input"
	}
	b := c.in[c.pos]
	if b >= 0x20 && b < 0x7f {
		return strconv.QuoteRune(rune(b))
	}
	return fmt.Sprintf("byte 0x%02x", b)
}

func (c *canonicalizer) skipWhitespace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value(depth int) error {
	if c.pos >= len(c.in) {
		return c.errorf("unexpected end of input, expected a value")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		return c.string(false)
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	default:
		return c.errorf("unexpected %s, expected a value", c.describe())
	}
}

func (c *canonicalizer) literal(word string) error {
	if len(c.in)-c.pos < len(word) || string(c.in[c.pos:c.pos+len(word)]) != word {
		return c.errorf("invalid literal, expected %q", word)
	}
	c.pos += len(word)
	c.out = append(c.out, word...)
	return nil
}

func (c *canonicalizer) array(depth int) error {
	if depth > maxDepth {
		return c.errorf("nesting deeper than %d", maxDepth)
	}
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.skipWhitespace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipWhitespace()
		if c.pos >= len(c.in) {
			return c.errorf("unexpected end of input in array, expected ',' or ']'")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
			c.skipWhitespace()
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return c.errorf("unexpected %s in array, expected ',' or ']'", c.describe())
		}
	}
}

func (c *canonicalizer) object(depth int) error {
	if depth > maxDepth {
		return c.errorf("nesting deeper than %d", maxDepth)
	}
	c.pos++ // '{'
	c.out = append(c.out, '{')
	c.skipWhitespace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}

	firstMember := len(c.members)
	namesBase := len(c.names)
	bodyStart := len(c.out)
	for {
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return c.errorf("unexpected %s in object, expected a member name", c.describe())
		}
		member := memberRef{inOffset: c.pos, nameStart: len(c.names), outStart: len(c.out)}
		if err := c.string(true); err != nil {
			return err
		}
		member.nameEnd = len(c.names)
		c.skipWhitespace()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return c.errorf("unexpected %s after member name, expected ':'", c.describe())
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipWhitespace()
		if err := c.value(depth); err != nil {
			return err
		}
		member.outEnd = len(c.out)
		c.members = append(c.members, member)

		c.skipWhitespace()
		if c.pos >= len(c.in) {
			return c.errorf("unexpected end of input in object, expected ',' or '}'")
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		if c.in[c.pos] != ',' {
			return c.errorf("unexpected %s in object, expected ',' or '}'", c.describe())
		}
		c.pos++
		c.out = append(c.out, ',')
		c.skipWhitespace()
	}

	if err := c.sortMembers(c.members[firstMember:], bodyStart); err != nil {
		return err
	}
	c.out = append(c.out, '}')
	c.members = c.members[:firstMember]
	c.names = c.names[:namesBase]
	return nil
}

// sortMembers puts the members of one object, whose bytes start at
// c.out[bodyStart:], in canonical order and refuses duplicate names.
func (c *canonicalizer) sortMembers(members []memberRef, bodyStart int) error {
	if err := c.refuseCaseVariants(members); err != nil {
		return err
	}
	// Documents are usually small objects, often already sorted (a client
	// that canonicalises, or a retry of one), so check before moving bytes.
	sorted := true
	for i := 1; i < len(members); i++ {
		if c.compareNames(&members[i-1], &members[i]) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return nil
	}

	// Insertion sort: stable, no allocation, and objects in requests are
	// small. Large objects fall back to a merge sort below.
	if len(members) <= 32 {
		for i := 1; i < len(members); i++ {
			for j := i; j > 0 && c.compareNames(&members[j-1], &members[j]) > 0; j-- {
				members[j-1], members[j] = members[j], members[j-1]
			}
		}
	} else {
		members = c.mergeSort(members)
	}
	c.scratch = append(c.scratch[:0], c.out[bodyStart:]...)
	c.out = c.out[:bodyStart]
	for i, m := range members {
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[m.outStart-bodyStart:m.outEnd-bodyStart]...)
	}
	return nil
}

// mergeSort is a stable bottom-up merge sort of members, which must be the
// tail of c.members. It borrows its buffer from beyond that tail, so it does
// not allocate once warm, and returns members anew because growing c.members
// may have moved them.
func (c *canonicalizer) mergeSort(members []memberRef) []memberRef {
	n := len(members)
	base := len(c.members)
	for range n {
		c.members = append(c.members, memberRef{})
	}
	members = c.members[base-n : base]
	buf := c.members[base : base+n]

	src, dst := members, buf
	for width := 1; width < n; width *= 2 {
		for lo := 0; lo < n; lo += 2 * width {
			mid := min(lo+width, n)
			hi := min(lo+2*width, n)
			i, j, k := lo, mid, lo
			for i < mid && j < hi {
				if c.compareNames(&src[j], &src[i]) < 0 {
					dst[k] = src[j]
					j++
				} else {
					dst[k] = src[i]
					i++
				}
				k++
			}
			k += copy(dst[k:], src[i:mid])
			copy(dst[k:], src[j:hi])
		}
		src, dst = dst, src
	}
	if &src[0] != &members[0] {
		copy(members, src)
	}
	c.members = c.members[:base]
	return members
}

// compareNames orders member names by their UTF-16 code units (RFC 8785
// §3.2.3). UTF-8 byte order equals code point order, which equals UTF-16
// order except that code points from U+10000 up (written as surrogates,
// 0xD800-0xDFFF) sort before U+E000-U+FFFF in UTF-16. So compare bytes, and
// only at the first difference decode the two runes and compare them as
// UTF-16.
// refuseCaseVariants refuses an object with two member names that differ
// only in case ("quantity" and "QUANTITY"): encoding/json reads either for
// the same field, the later one winning, and the sorted order would no
// longer say which came later, so two documents that decode differently
// would have one canonical form. Exact duplicates are fine: sorting keeps
// their input order.
func (c *canonicalizer) refuseCaseVariants(members []memberRef) error {
	name := func(m *memberRef) []byte { return c.names[m.nameStart:m.nameEnd] }
	report := func(a, b *memberRef) error {
		c.pos = max(a.inOffset, b.inOffset)
		return c.errorf("member names %s and %s differ only in case, which a decoder reads as one field", quoteName(name(a)), quoteName(name(b)))
	}
	if len(members) <= 32 {
		for i := range members {
			for j := i + 1; j < len(members); j++ {
				if x, y := name(&members[i]), name(&members[j]); !bytes.Equal(x, y) && foldEqual(x, y) {
					return report(&members[i], &members[j])
				}
			}
		}
		return nil
	}
	seen := make(map[string]*memberRef, len(members))
	for i := range members {
		m := &members[i]
		folded := string(appendFolded(nil, name(m)))
		if other, ok := seen[folded]; ok && !bytes.Equal(name(other), name(m)) {
			return report(other, m)
		}
		seen[folded] = m
	}
	return nil
}

// appendFolded appends name folded as encoding/json folds member names
// when it matches them to fields.
func appendFolded(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		if b := name[i]; b < utf8.RuneSelf {
			if 'a' <= b && b <= 'z' {
				b -= 'a' - 'A'
			}
			dst = append(dst, b)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, unicode.ToUpper(unicode.ToLower(r)))
		i += n
	}
	return dst
}

// foldEqual reports whether x and y fold to the same name.
func foldEqual(x, y []byte) bool {
	var a, b [64]byte
	return bytes.Equal(appendFolded(a[:0], x), appendFolded(b[:0], y))
}

func (c *canonicalizer) compareNames(a, b *memberRef) int {
	x := c.names[a.nameStart:a.nameEnd]
	y := c.names[b.nameStart:b.nameEnd]
	i := 0
	for i < len(x) && i < len(y) && x[i] == y[i] {
		i++
	}
	if i == len(x) || i == len(y) {
		return len(x) - len(y)
	}
	// Back up to the start of the rune that differs; names are valid UTF-8.
	for i > 0 && !utf8.RuneStart(x[i]) {
		i--
	}
	rx, _ := utf8.DecodeRune(x[i:])
	ry, _ := utf8.DecodeRune(y[i:])
	return canonCompareUTF16(rx, ry)
}

func canonCompareUTF16(a, b rune) int {
	ua, _ := utf16.EncodeRune(a)
	ub, _ := utf16.EncodeRune(b)
	if ua == utf8.RuneError {
		ua = a // a is in the BMP: it is its own code unit
	}
	if ub == utf8.RuneError {
		ub = b
	}
	if ua != ub {
		return int(ua) - int(ub)
	}
	// Same first code unit: both are astral with the same high surrogate,
	// and for those code point order is UTF-16 order.
	return int(a) - int(b)
}

// string reads a string token and writes its canonical form. For a member
// name it also appends the unescaped name to c.names, for sorting and the
// duplicate check.
func (c *canonicalizer) string(isName bool) error {
	start := c.pos
	c.pos++ // opening quote
	c.out = append(c.out, '"')
	for {
		// Copy the longest run of bytes that need no attention at once.
		runStart := c.pos
		for c.pos < len(c.in) {
			b := c.in[c.pos]
			if b < 0x20 || b == '"' || b == '\\' || b >= utf8.RuneSelf {
				break
			}
			c.pos++
		}
		if c.pos > runStart {
			c.out = append(c.out, c.in[runStart:c.pos]...)
			if isName {
				c.names = append(c.names, c.in[runStart:c.pos]...)
			}
		}
		if c.pos >= len(c.in) {
			c.pos = start
			return c.errorf("unterminated string")
		}

		switch b := c.in[c.pos]; {
		case b == '"':
			c.pos++
			c.out = append(c.out, '"')
			return nil
		case b == '\\':
			r, err := c.escape()
			if err != nil {
				return err
			}
			c.appendStringRune(r, isName)
		case b < 0x20:
			return c.errorf("unescaped control character 0x%02x in string", b)
		default:
			r, size := utf8.DecodeRune(c.in[c.pos:])
			if r == utf8.RuneError && size <= 1 {
				c.appendStringRune(utf8.RuneError, isName)
				c.pos += size
				continue
			}
			c.out = append(c.out, c.in[c.pos:c.pos+size]...)
			if isName {
				c.names = append(c.names, c.in[c.pos:c.pos+size]...)
			}
			c.pos += size
		}
	}
}

// escape decodes the escape sequence at c.pos, joining a \uD8xx\uDCxx
// surrogate pair into one rune.
func (c *canonicalizer) escape() (rune, error) {
	if c.pos+1 >= len(c.in) {
		return 0, c.errorf("unterminated escape sequence")
	}
	switch c.in[c.pos+1] {
	case '"':
		c.pos += 2
		return '"', nil
	case '\\':
		c.pos += 2
		return '\\', nil
	case '/':
		c.pos += 2
		return '/', nil
	case 'b':
		c.pos += 2
		return '\b', nil
	case 'f':
		c.pos += 2
		return '\f', nil
	case 'n':
		c.pos += 2
		return '\n', nil
	case 'r':
		c.pos += 2
		return '\r', nil
	case 't':
		c.pos += 2
		return '\t', nil
	case 'u':
	default:
		return 0, c.errorf("invalid escape sequence \\%c", rune(c.in[c.pos+1]))
	}

	r, ok := canonHex4(c.in[c.pos+2:])
	if !ok {
		return 0, c.errorf("invalid \\u escape, expected four hex digits")
	}
	switch {
	case r >= 0xD800 && r <= 0xDFFF:
		return c.looseSurrogate(r), nil
	default:
		c.pos += 6
		return r, nil
	}
}

// looseSurrogate reads the escaped surrogate r at c.pos as encoding/json
// does: joined with a low surrogate escape that follows a high one, else
// U+FFFD for r alone.
func (c *canonicalizer) looseSurrogate(r rune) rune {
	if r <= 0xDBFF {
		if rest := c.in[c.pos+6:]; len(rest) >= 6 && rest[0] == '\\' && rest[1] == 'u' {
			if low, ok := canonHex4(rest[2:]); ok && low >= 0xDC00 && low <= 0xDFFF {
				c.pos += 12
				return utf16.DecodeRune(r, low)
			}
		}
	}
	c.pos += 6
	return utf8.RuneError
}

func canonHex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, h := range b[:4] {
		r <<= 4
		switch {
		case h >= '0' && h <= '9':
			r |= rune(h - '0')
		case h >= 'a' && h <= 'f':
			r |= rune(h - 'a' + 10)
		case h >= 'A' && h <= 'F':
			r |= rune(h - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// appendStringRune writes one unescaped rune in its RFC 8785 form.
func (c *canonicalizer) appendStringRune(r rune, isName bool) {
	if isName {
		c.names = utf8.AppendRune(c.names, r)
	}
	switch r {
	case '"':
		c.out = append(c.out, '\\', '"')
	case '\\':
		c.out = append(c.out, '\\', '\\')
	case '\b':
		c.out = append(c.out, '\\', 'b')
	case '\t':
		c.out = append(c.out, '\\', 't')
	case '\n':
		c.out = append(c.out, '\\', 'n')
	case '\f':
		c.out = append(c.out, '\\', 'f')
	case '\r':
		c.out = append(c.out, '\\', 'r')
	default:
		if r < 0x20 {
			const hexDigits = "0123456789abcdef"
			c.out = append(c.out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
			return
		}
		c.out = utf8.AppendRune(c.out, r)
	}
}

// number reads a number literal and writes its exact value in the
// ECMAScript Number::toString layout.
func (c *canonicalizer) number() error {
	start := c.pos
	negative := false
	if c.in[c.pos] == '-' {
		negative = true
		c.pos++
	}

	// Integer part: "0" or a non-zero digit followed by digits.
	intStart := c.pos
	switch {
	case c.pos < len(c.in) && c.in[c.pos] == '0':
		c.pos++
	case c.pos < len(c.in) && c.in[c.pos] >= '1' && c.in[c.pos] <= '9':
		c.pos = skipDigits(c.in, c.pos)
	default:
		return c.errorf("invalid number, expected a digit")
	}
	intDigits := c.in[intStart:c.pos]

	var fracDigits []byte
	if c.pos < len(c.in) && c.in[c.pos] == '.' {
		c.pos++
		fracStart := c.pos
		c.pos = skipDigits(c.in, c.pos)
		if c.pos == fracStart {
			return c.errorf("invalid number, expected a digit after '.'")
		}
		fracDigits = c.in[fracStart:c.pos]
	}

	// The exponent is accumulated with saturation: past maxExponent
	// plus the document's length it can only be refused (or multiply zero),
	// so its exact size does not matter and no digits are ever expanded.
	var exponent int64
	if c.pos < len(c.in) && (c.in[c.pos] == 'e' || c.in[c.pos] == 'E') {
		c.pos++
		expNegative := false
		if c.pos < len(c.in) && (c.in[c.pos] == '+' || c.in[c.pos] == '-') {
			expNegative = c.in[c.pos] == '-'
			c.pos++
		}
		expStart := c.pos
		for ; c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9'; c.pos++ {
			if exponent < 1<<40 {
				exponent = exponent*10 + int64(c.in[c.pos]-'0')
			}
		}
		if c.pos == expStart {
			return c.errorf("invalid number, expected a digit in the exponent")
		}
		if expNegative {
			exponent = -exponent
		}
	}

	// The value is the digit string intDigits+fracDigits times
	// 10^(exponent-len(fracDigits)). Find its significant digits without
	// concatenating: skip leading zeros, then trailing zeros.
	total := len(intDigits) + len(fracDigits)
	digitAt := func(i int) byte {
		if i < len(intDigits) {
			return intDigits[i]
		}
		return fracDigits[i-len(intDigits)]
	}
	first := 0
	for first < total && digitAt(first) == '0' {
		first++
	}
	if first == total {
		// Zero, whatever its sign or exponent.
		c.out = append(c.out, '0')
		return nil
	}
	last := total // exclusive
	for digitAt(last-1) == '0' {
		last--
	}

	// ECMAScript's n: the value is 0.d1d2...dk × 10^n.
	k := last - first
	n := int64(len(intDigits)-first) + exponent
	if n-1 > maxExponent || n-1 < -maxExponent {
		c.pos = start
		return c.errorf("number out of range: exponent beyond ±%d", maxExponent)
	}

	if negative {
		c.out = append(c.out, '-')
	}
	appendDigits := func(from, to int) {
		// At most two runs, each copied at once.
		for from < to {
			if from < len(intDigits) {
				end := min(to, len(intDigits))
				c.out = append(c.out, intDigits[from:end]...)
				from = end
				continue
			}
			c.out = append(c.out, fracDigits[from-len(intDigits):to-len(intDigits)]...)
			from = to
		}
	}
	kk := int64(k)
	switch {
	case kk <= n && n <= 21:
		appendDigits(first, last)
		for i := kk; i < n; i++ {
			c.out = append(c.out, '0')
		}
	case 0 < n && n <= 21:
		appendDigits(first, first+int(n))
		c.out = append(c.out, '.')
		appendDigits(first+int(n), last)
	case -6 < n && n <= 0:
		c.out = append(c.out, '0', '.')
		for i := n; i < 0; i++ {
			c.out = append(c.out, '0')
		}
		appendDigits(first, last)
	default:
		appendDigits(first, first+1)
		if k > 1 {
			c.out = append(c.out, '.')
			appendDigits(first+1, last)
		}
		c.out = append(c.out, 'e')
		if n-1 >= 0 {
			c.out = append(c.out, '+')
		}
		c.out = strconv.AppendInt(c.out, n-1, 10)
	}
	return nil
}

// quoteName quotes a member name for an error message, shortened so that
// a hostile document cannot make its error message huge.
func quoteName(name []byte) string {
	const limit = 64
	if len(name) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		return strconv.Quote(string(name[:cut])) + "..."
	}
	return strconv.Quote(string(name))
}

func skipDigits(b []byte, pos int) int {
	for pos < len(b) && b[pos] >= '0' && b[pos] <= '9' {
		pos++
	}
	return pos
}
