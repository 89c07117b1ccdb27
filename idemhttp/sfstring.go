package idemhttp

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// sfParser is an RFC 9651 §4.2 parser for just what an Idempotency-Key
// header can hold: an Item, its Parameters and, to say precisely why it is
// refused, the rest of a List. Positions in errors are byte offsets into the
// trimmed header value.
type sfParser struct {
	s   string
	pos int
}

func (p *sfParser) errorf(format string, args ...any) error {
	return malformed("%s at position %d", fmt.Sprintf(format, args...), p.pos)
}

// describe names the character at p.pos for error messages.
func (p *sfParser) describe() string {
	if p.pos >= len(p.s) {
		return "end of value"
	}
	if c := p.s[p.pos]; c >= 0x20 && c <= 0x7e {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", p.s[p.pos])
}

// trailing explains what follows a complete Item. A comma starts a List: if
// the rest parses as list members, the value holds several keys, which is
// ambiguous; otherwise it is simply invalid.
func (p *sfParser) trailing() error {
	rest := p.pos
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
	if p.pos >= len(p.s) || p.s[p.pos] != ',' {
		p.pos = rest
		return p.errorf("unexpected %s after the sf-string", p.describe())
	}
	members := 1
	for p.pos < len(p.s) {
		p.pos++ // ','
		p.skipOWS()
		if p.pos >= len(p.s) {
			return p.errorf("list ends with a comma")
		}
		if err := p.listMember(); err != nil {
			return err
		}
		members++
		p.skipOWS()
		if p.pos < len(p.s) && p.s[p.pos] != ',' {
			return p.errorf("unexpected %s in list, expected ','", p.describe())
		}
	}
	return malformed("value is a list of %d members; send exactly one key", members)
}

func (p *sfParser) skipOWS() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

func (p *sfParser) skipSP() {
	for p.pos < len(p.s) && p.s[p.pos] == ' ' {
		p.pos++
	}
}

// listMember parses an Item or an Inner List with its parameters
// (RFC 9651 §4.2.1.1).
func (p *sfParser) listMember() error {
	if p.s[p.pos] != '(' {
		if err := p.bareItem(); err != nil {
			return err
		}
		return p.parameters()
	}
	p.pos++
	for {
		p.skipSP()
		if p.pos >= len(p.s) {
			return p.errorf("unterminated inner list")
		}
		if p.s[p.pos] == ')' {
			p.pos++
			return p.parameters()
		}
		if err := p.bareItem(); err != nil {
			return err
		}
		if err := p.parameters(); err != nil {
			return err
		}
		if p.pos >= len(p.s) {
			return p.errorf("unterminated inner list")
		}
		if p.s[p.pos] != ' ' && p.s[p.pos] != ')' {
			return p.errorf("unexpected %s in inner list", p.describe())
		}
	}
}

// parameters parses ;key[=value] pairs (RFC 9651 §4.2.3.2). Their values
// are checked and dropped: the draft defines no parameters for this header,
// and unknown ones must be ignored.
func (p *sfParser) parameters() error {
	for p.pos < len(p.s) && p.s[p.pos] == ';' {
		p.pos++
		p.skipSP()
		if err := p.key(); err != nil {
			return err
		}
		if p.pos < len(p.s) && p.s[p.pos] == '=' {
			p.pos++
			if err := p.bareItem(); err != nil {
				return err
			}
		}
	}
	return nil
}

// key parses a parameter key (RFC 9651 §4.2.3.3).
func (p *sfParser) key() error {
	if p.pos >= len(p.s) || !(isLCAlpha(p.s[p.pos]) || p.s[p.pos] == '*') {
		return p.errorf("unexpected %s, expected a parameter name", p.describe())
	}
	p.pos++
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		if !isLCAlpha(c) && !isDigit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.pos++
	}
	return nil
}

// bareItem parses and discards any Bare Item (RFC 9651 §4.2.3.1).
func (p *sfParser) bareItem() error {
	if p.pos >= len(p.s) {
		return p.errorf("unexpected end of value, expected a value")
	}
	switch c := p.s[p.pos]; {
	case c == '-' || isDigit(c):
		_, err := p.number()
		return err
	case c == '"':
		_, err := p.string()
		return err
	case isAlpha(c) || c == '*':
		p.token()
		return nil
	case c == ':':
		return p.byteSequence()
	case c == '?':
		return p.boolean()
	case c == '@':
		return p.date()
	case c == '%':
		return p.displayString()
	default:
		return p.errorf("unexpected %s, expected a value", p.describe())
	}
}

// string parses an sf-string (RFC 9651 §4.2.5). Without escapes it
// returns a substring of the input and does not allocate.
func (p *sfParser) string() (string, error) {
	start := p.pos
	p.pos++ // opening '"'
	contentStart := p.pos
	escapes := 0
	for {
		if p.pos >= len(p.s) {
			p.pos = start
			return "", p.errorf("unterminated sf-string")
		}
		switch c := p.s[p.pos]; {
		case c == '\\':
			p.pos++
			if p.pos >= len(p.s) {
				p.pos = start
				return "", p.errorf("unterminated sf-string")
			}
			if next := p.s[p.pos]; next != '"' && next != '\\' {
				p.pos--
				return "", p.errorf(`invalid escape in sf-string (only \" and \\ are allowed)`)
			}
			escapes++
			p.pos++
		case c == '"':
			content := p.s[contentStart:p.pos]
			p.pos++
			if escapes == 0 {
				return content, nil
			}
			return unescapeString(content, escapes), nil
		case c < 0x20 || c > 0x7e:
			return "", p.errorf("byte 0x%02x in sf-string; only printable ASCII is allowed", c)
		default:
			p.pos++
		}
	}
}

// unescapeString removes the backslashes of a validated sf-string's content.
func unescapeString(content string, escapes int) string {
	var b strings.Builder
	b.Grow(len(content) - escapes)
	for i := 0; i < len(content); i++ {
		if content[i] == '\\' {
			i++
		}
		b.WriteByte(content[i])
	}
	return b.String()
}

// number parses an Integer or Decimal (RFC 9651 §4.2.4) and reports
// whether it was a Decimal.
func (p *sfParser) number() (isDecimal bool, err error) {
	if p.pos < len(p.s) && p.s[p.pos] == '-' {
		p.pos++
	}
	if p.pos >= len(p.s) || !isDigit(p.s[p.pos]) {
		return false, p.errorf("unexpected %s, expected a digit", p.describe())
	}
	numStart, dot := p.pos, -1
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case isDigit(c):
		case c == '.' && dot < 0:
			if p.pos-numStart > 12 {
				return false, p.errorf("decimal with more than 12 integer digits")
			}
			dot = p.pos
		default:
			goto done
		}
		p.pos++
		if dot < 0 && p.pos-numStart > 15 {
			return false, p.errorf("integer with more than 15 digits")
		}
		if dot >= 0 && p.pos-numStart > 16 {
			return false, p.errorf("decimal longer than 16 characters")
		}
	}
done:
	if dot >= 0 {
		if p.pos-dot-1 == 0 {
			return false, p.errorf("decimal ends with '.'")
		}
		if p.pos-dot-1 > 3 {
			return false, p.errorf("decimal with more than 3 fraction digits")
		}
	}
	return dot >= 0, nil
}

// token parses a Token (RFC 9651 §4.2.6); its first character is checked
// by the caller.
func (p *sfParser) token() {
	p.pos++
	for p.pos < len(p.s) && (isTChar(p.s[p.pos]) || p.s[p.pos] == ':' || p.s[p.pos] == '/') {
		p.pos++
	}
}

// byteSequence parses a Byte Sequence (RFC 9651 §4.2.7). The content is
// checked for the base64 alphabet and a possible length, not decoded.
// Missing '=' padding and non-zero pad bits are tolerated, as the RFC asks.
func (p *sfParser) byteSequence() error {
	start := p.pos
	p.pos++ // ':'
	end := strings.IndexByte(p.s[p.pos:], ':')
	if end < 0 {
		p.pos = start
		return p.errorf("unterminated byte sequence")
	}
	content := p.s[p.pos : p.pos+end]
	data := strings.TrimRight(content, "=")
	if len(content)-len(data) > 2 || len(data)%4 == 1 {
		return p.errorf("invalid base64 in byte sequence")
	}
	for i := range len(data) {
		if c := data[i]; !isAlpha(c) && !isDigit(c) && c != '+' && c != '/' {
			p.pos += i
			return p.errorf("unexpected %s in byte sequence", p.describe())
		}
	}
	p.pos += end + 1
	return nil
}

// boolean parses a Boolean (RFC 9651 §4.2.8).
func (p *sfParser) boolean() error {
	p.pos++ // '?'
	if p.pos >= len(p.s) || (p.s[p.pos] != '0' && p.s[p.pos] != '1') {
		return p.errorf("unexpected %s, expected a boolean ?0 or ?1", p.describe())
	}
	p.pos++
	return nil
}

// date parses a Date (RFC 9651 §4.2.9).
func (p *sfParser) date() error {
	p.pos++ // '@'
	start := p.pos
	isDecimal, err := p.number()
	if err != nil {
		return err
	}
	if isDecimal {
		p.pos = start
		return p.errorf("date is not an integer")
	}
	return nil
}

// displayString parses a Display String (RFC 9651 §4.2.10): %"..." with
// lowercase %xx escapes that must decode to valid UTF-8.
func (p *sfParser) displayString() error {
	start := p.pos
	if p.pos+1 >= len(p.s) || p.s[p.pos+1] != '"' {
		p.pos++
		return p.errorf(`unexpected %s, expected '"' after '%%'`, p.describe())
	}
	p.pos += 2
	var decoded []byte
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case c == '%':
			if p.pos+2 >= len(p.s) || !isLCHex(p.s[p.pos+1]) || !isLCHex(p.s[p.pos+2]) {
				return p.errorf("invalid %%-escape in display string (two lowercase hex digits expected)")
			}
			decoded = append(decoded, lcHexValue(p.s[p.pos+1])<<4|lcHexValue(p.s[p.pos+2]))
			p.pos += 3
		case c == '"':
			if !utf8.Valid(decoded) {
				p.pos = start
				return p.errorf("display string is not valid UTF-8")
			}
			p.pos++
			return nil
		case c < 0x20 || c > 0x7e:
			return p.errorf("byte 0x%02x in display string", c)
		default:
			decoded = append(decoded, c)
			p.pos++
		}
	}
	p.pos = start
	return p.errorf("unterminated display string")
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }
func isLCHex(c byte) bool   { return isDigit(c) || (c >= 'a' && c <= 'f') }

func lcHexValue(c byte) byte {
	if isDigit(c) {
		return c - '0'
	}
	return c - 'a' + 10
}

// isTChar reports whether c is an RFC 9110 tchar.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
