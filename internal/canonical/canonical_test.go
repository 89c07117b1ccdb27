package canonical_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/canonical"
	"github.com/go-idem/idem/internal/testfixture"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want string
	}{
		// Structure and whitespace.
		{"Null", `null`, `null`},
		{"True", ` true `, `true`},
		{"False", "\t\r\nfalse\n", `false`},
		{"EmptyObject", `{ }`, `{}`},
		{"EmptyArray", `[ ]`, `[]`},
		{"Whitespace", " {\n\t\"a\" :\r\n [ 1 , 2 ] ,\"b\": { } } ", `{"a":[1,2],"b":{}}`},
		{"ArrayKeepsOrder", `[3,1,2,"b","a"]`, `[3,1,2,"b","a"]`},
		{"KeysSorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"KeysSortedNested", `{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		{"KeyPrefixSortsFirst", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{"SameNameInDifferentObjects", `{"a":{"a":1},"b":[{"a":1},{"a":1}]}`, `{"a":{"a":1},"b":[{"a":1},{"a":1}]}`},
		{"Rides", `{"target_lon":-121.8863,"origin_lat":37.7749,"target_lat":37.3382,"origin_lon":-122.4194}`,
			`{"origin_lat":37.7749,"origin_lon":-122.4194,"target_lat":37.3382,"target_lon":-121.8863}`},

		// Strings.
		{"StringPlain", `"hello"`, `"hello"`},
		{"StringEscapedLetter", `"\u0041\u00e9"`, `"Aé"`},
		{"StringLiteralUnicode", `"Aé"`, `"Aé"`},
		{"StringUppercaseHexEscape", `"\u00C9"`, `"É"`},
		{"StringSolidus", `"a\/b/c"`, `"a/b/c"`},
		{"StringShortEscapes", `"\"\\\b\f\n\r\t"`, `"\"\\\b\f\n\r\t"`},
		{"StringControlAsShortEscape", `"\u0008\u0009\u000A\u000c\u000D"`, `"\b\t\n\f\r"`},
		{"StringControlAsHex", `"\u0000\u0001\u001F\u000B"`, `"\u0000\u0001\u001f\u000b"`},
		{"StringQuoteAndBackslashEscaped", `"\u0022\u005c"`, `"\"\\"`},
		{"StringDELLiteral", `"\u007f"`, "\"\x7f\""},
		{"StringLineSeparatorLiteral", `"\u2028\u2029"`, "\"\u2028\u2029\""},
		{"StringReplacementCharLiteral", `"\ufffd"`, "\"\ufffd\""},
		{"StringSurrogatePair", `"\ud83d\ude00"`, `"😀"`},
		{"StringSurrogatePairUppercase", `"\uD83D\uDE00"`, `"😀"`},
		{"StringAstralLiteral", `"😀"`, `"😀"`},
		{"StringHighestCodePoint", `"\udbff\udfff"`, "\"\U0010ffff\""},

		// Numbers: exact value, ECMAScript layout.
		{"NumberZero", `0`, `0`},
		{"NumberNegativeZero", `-0`, `0`},
		{"NumberNegativeZeroFraction", `-0.000`, `0`},
		{"NumberZeroHugeExponent", `0e99999999999999999999`, `0`},
		{"NumberZeroHugeNegativeExponent", `-0.0E-99999999999999999999`, `0`},
		{"NumberOne", `1`, `1`},
		{"NumberOnePointZero", `1.0`, `1`},
		{"NumberOneE0", `1e0`, `1`},
		{"NumberTenEMinus1", `10e-1`, `1`},
		{"NumberPointOneE1", `0.1e1`, `1`},
		{"NumberUppercaseE", `1E+2`, `100`},
		{"NumberTrailingZeros", `-1.50`, `-1.5`},
		{"NumberHundredEMinus2", `100e-2`, `1`},
		{"NumberLeadingZeroExponent", `5e0003`, `5000`},
		{"NumberBigIntegerExact", `12345678901234567890`, `12345678901234567890`},
		{"NumberBigIntegerRounded", `12345678901234567000`, `12345678901234567000`},
		{"NumberNonShortestKept", `333333333.33333329`, `333333333.33333329`},
		{"NumberTwentyOneDigits", `123e18`, `123000000000000000000`},
		{"NumberTwentyTwoDigits", `1e21`, `1e+21`},
		{"NumberLongIntegerToExponent", `123456789012345678901234567890`, `1.2345678901234567890123456789e+29`},
		{"NumberFraction", `1234.5678`, `1234.5678`},
		{"NumberFractionWithExponent", `1.2345678e3`, `1234.5678`},
		{"NumberSmallFraction", `0.00001234`, `0.00001234`},
		{"NumberMicro", `0.000001`, `0.000001`},
		{"NumberBelowMicro", `0.0000001`, `1e-7`},
		{"NumberBelowMicroDigits", `0.00000015`, `1.5e-7`},
		{"NumberNegativeExponentForm", `-12.5e-10`, `-1.25e-9`},
		{"NumberLongFractionExact", `0.1000000000000000000000000001`, `0.1000000000000000000000000001`},
		{"NumberHugeExponent", `1e999999`, `1e+999999`},
		{"NumberLargestExponent", `10e999999`, `1e+1000000`},
		{"NumberSmallestExponent", `0.1e-999999`, `1e-1000000`},
		{"NumberExponentNormalisedIntoRange", `0.0001e1000003`, `1e+999999`},
		{"NumberExponentDigitsNormalisedIntoRange", `1000000e999994`, `1e+1000000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := canonical.JSON([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))

			again, err := canonical.JSON(got)
			require.NoError(t, err)
			require.Equal(t, string(got), string(again), "not idempotent")
			require.True(t, json.Valid(got))
		})
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		in      string
		wantMsg string
	}{
		// Syntax.
		{"Empty", ``, "unexpected end of input, expected a value at offset 0"},
		{"OnlyWhitespace", " \n", "unexpected end of input, expected a value at offset 2"},
		{"ByteOrderMark", "\ufeff{}", "unexpected byte 0xef, expected a value at offset 0"},
		{"UnclosedObject", `{`, "expected a member name at offset 1"},
		{"UnclosedArray", `[1`, "unexpected end of input in array"},
		{"TrailingCommaArray", `[1,]`, `unexpected ']', expected a value at offset 3`},
		{"TrailingCommaObject", `{"a":1,}`, `unexpected '}' in object, expected a member name at offset 7`},
		{"MissingColon", `{"a" 1}`, `unexpected '1' after member name, expected ':' at offset 5`},
		{"NonStringKey", `{1:2}`, "expected a member name at offset 1"},
		{"MissingComma", `[1 2]`, `unexpected '2' in array, expected ',' or ']' at offset 3`},
		{"MissingCommaObject", `{"a":1 "b":2}`, `unexpected '"' in object, expected ',' or '}' at offset 7`},
		{"TrailingValue", `1 2`, `unexpected '2' after the top-level value at offset 2`},
		{"TrailingGarbage", `{}x`, `unexpected 'x' after the top-level value at offset 2`},
		{"TrailingNUL", "{}\x00", "unexpected byte 0x00 after the top-level value at offset 2"},
		{"SingleQuotes", `{'a':1}`, "expected a member name at offset 1"},
		{"BadLiteral", `tru`, `invalid literal, expected "true" at offset 0`},
		{"BadLiteralCase", `Null`, `unexpected 'N', expected a value`},
		{"Comment", `[1 /* x */]`, `unexpected '/' in array`},

		// Numbers.
		{"NumberLeadingZero", `01`, `unexpected '1' after the top-level value at offset 1`},
		{"NumberNegativeLeadingZero", `-01`, `unexpected '1' after the top-level value`},
		{"NumberLoneMinus", `-`, "invalid number, expected a digit at offset 1"},
		{"NumberPlusSign", `+1`, `unexpected '+', expected a value`},
		{"NumberTrailingDot", `1.`, "expected a digit after '.' at offset 2"},
		{"NumberDotExponent", `1.e5`, "expected a digit after '.' at offset 2"},
		{"NumberLeadingDot", `.5`, `unexpected '.', expected a value`},
		{"NumberEmptyExponent", `1e`, "expected a digit in the exponent at offset 2"},
		{"NumberEmptySignedExponent", `1e+`, "expected a digit in the exponent at offset 3"},
		{"NumberHex", `0x10`, `unexpected 'x' after the top-level value`},
		{"NumberNaN", `NaN`, `unexpected 'N', expected a value`},
		{"NumberInfinity", `-Infinity`, "invalid number, expected a digit at offset 1"},
		{"NumberExponentTooLarge", `[1e1000001]`, "number out of range: exponent beyond ±1000000 at offset 1"},
		{"NumberExponentTooSmall", `0.01e-999999`, "number out of range"},
		{"NumberExponentDigitsTooLarge", `10000000e999994`, "number out of range"},
		{"NumberExponentHuge", `1e99999999999999999999999999999999999999`, "number out of range"},
		{"NumberExponentHugeNegative", `-5E-99999999999999999999999999999999999999`, "number out of range"},

		// Strings.
		{"Unterminated", `"abc`, "unterminated string at offset 0"},
		{"RawNewline", "\"a\nb\"", "unescaped control character 0x0a in string at offset 2"},
		{"RawTab", "\"a\tb\"", "unescaped control character 0x09 in string"},
		{"RawNUL", "\"\x00\"", "unescaped control character 0x00 in string"},
		{"BadEscape", `"\x41"`, `invalid escape sequence \x at offset 1`},
		{"EscapeAtEnd", `"\`, "unterminated escape sequence at offset 1"},
		{"ShortUnicodeEscape", `"\u12"`, `invalid \u escape, expected four hex digits at offset 1`},
		{"NonHexUnicodeEscape", `"\u12g4"`, `invalid \u escape`},
		{"InvalidUTF8OutsideString", "[\xff]", "unexpected byte 0xff, expected a value at offset 1"},

		// Names that differ only in case (encoding/json reads them as one
		// field; the canonical order could not say which came last).
		{"CaseVariants", `{"a":1,"A":2}`, `differ only in case`},

		// Depth.
		{"TooDeepArrays", strings.Repeat("[", 10001) + strings.Repeat("]", 10001), "nesting deeper than 10000 at offset 10000"},
		{"TooDeepObjects", strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001), "nesting deeper than 10000 at offset 50000"},
		{"TooDeepUnclosed", strings.Repeat("[", 100_000), "nesting deeper than 10000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := canonical.JSON([]byte(tt.in))
			require.ErrorIs(t, err, canonical.ErrInvalidJSON)
			require.ErrorContains(t, err, tt.wantMsg)
			require.Nil(t, got)

			prefixed, err := canonical.Append([]byte("flow\x00"), []byte(tt.in))
			require.ErrorIs(t, err, canonical.ErrInvalidJSON)
			require.Equal(t, "flow\x00", string(prefixed), "Append returns dst unchanged on error")
		})
	}
}

func TestCanonicalJSONDepthLimit(t *testing.T) {
	t.Parallel()

	arrays := strings.Repeat("[", 512) + strings.Repeat("]", 512)
	got, err := canonical.JSON([]byte(arrays))
	require.NoError(t, err)
	require.Equal(t, arrays, string(got))

	objects := strings.Repeat(`{"a":`, 511) + "[]" + strings.Repeat("}", 511)
	got, err = canonical.JSON([]byte(objects))
	require.NoError(t, err)
	require.Equal(t, objects, string(got))
}

// TestCanonicalJSONMemberOrder checks RFC 8785 §3.2.3: names sort by UTF-16
// code units, which differs from byte (code point) order for astral-plane
// characters against U+E000-U+FFFF.
func TestCanonicalJSONMemberOrder(t *testing.T) {
	t.Parallel()

	t.Run("RFC8785Example", func(t *testing.T) {
		t.Parallel()

		// RFC 8785 §3.2.3.
		in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
		want := `{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","ö":"Latin Small Letter O With Diaeresis",` +
			`"€":"Euro Sign","😀":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`
		got, err := canonical.JSON([]byte(in))
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	})

	t.Run("AstralBeforePrivateUse", func(t *testing.T) {
		t.Parallel()

		// U+1F600 is 0xD83D 0xDE00 in UTF-16, so it sorts before U+E000 and
		// U+FFFF even though its code point (and UTF-8) is greater.
		got, err := canonical.JSON([]byte(`{"\uffff":1,"\ue000":2,"😀":3,"\ud7ff":4,"𐀀":5}`))
		require.NoError(t, err)
		require.Equal(t, "{\"\ud7ff\":4,\"𐀀\":5,\"😀\":3,\"\ue000\":2,\"\uffff\":1}", string(got))
	})

	t.Run("AstralAmongThemselves", func(t *testing.T) {
		t.Parallel()

		// Same high surrogate (0xD83D), different low surrogates; then a
		// different high surrogate.
		got, err := canonical.JSON([]byte(`{"😁":1,"😀":2,"🀀":3,"a😀":4,"a":5}`))
		require.NoError(t, err)
		require.Equal(t, `{"a":5,"a😀":4,"🀀":3,"😀":2,"😁":1}`, string(got))
	})

	t.Run("EscapedNamesSortByValue", func(t *testing.T) {
		t.Parallel()

		// '"' (0x22) sorts before '#' (0x23) and after '!' (0x21) by value,
		// although its escaped form starts with '\' (0x5C).
		got, err := canonical.JSON([]byte(`{"#":1,"\"":2,"!":3,"\u0000":4,"\\":5,"[":6}`))
		require.NoError(t, err)
		require.Equal(t, `{"\u0000":4,"!":3,"\"":2,"#":1,"[":6,"\\":5}`, string(got))
	})

	t.Run("LargeObjects", func(t *testing.T) {
		t.Parallel()

		// Objects past the insertion-sort threshold, with names drawn from
		// ranges where UTF-16 and UTF-8 order disagree.
		alphabet := []rune{'a', 'b', 'é', '\u20ac', '\ue000', '\uffff', '😀', '😁', '𐀀', '\U0010ffff'}
		rng := rand.New(rand.NewPCG(1, 2))
		for _, size := range []int{33, 34, 100, 1000} {
			names := canonRandomNames(rng, alphabet, size)

			var doc strings.Builder
			doc.WriteString("{")
			for i, name := range names {
				if i > 0 {
					doc.WriteString(", ")
				}
				fmt.Fprintf(&doc, "%s: %d", canonQuote(name), i)
			}
			doc.WriteString("}")

			got, err := canonical.JSON([]byte(doc.String()))
			require.NoError(t, err)

			var order []string
			dec := json.NewDecoder(bytes.NewReader(got))
			_, err = dec.Token() // {
			require.NoError(t, err)
			for dec.More() {
				tok, err := dec.Token()
				require.NoError(t, err)
				order = append(order, tok.(string)) //nolint:forcetypeassert // names are strings
				_, err = dec.Token()
				require.NoError(t, err)
			}
			want := slices.Clone(names)
			slices.SortFunc(want, func(a, b string) int {
				return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
			})
			require.Equal(t, want, order, "size %d", size)

			// A duplicate anywhere in a large object is kept, after the
			// first, as encoding/json reads the last one.
			dup := doc.String()[:doc.Len()-1] + ", " + canonQuote(names[size/2]) + ": 0}"
			_, err = canonical.JSON([]byte(dup))
			require.NoError(t, err)
		}
	})
}

// canonRandomNames returns n distinct random names over alphabet.
func canonRandomNames(rng *rand.Rand, alphabet []rune, n int) []string {
	seen := make(map[string]bool, n)
	names := make([]string, 0, n)
	for len(names) < n {
		runes := make([]rune, 1+rng.IntN(4))
		for i := range runes {
			runes[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if name := string(runes); !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// canonQuote writes s as a JSON string, escaping astral characters as
// surrogate pairs half of the time so that both spellings are exercised.
func canonQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		if r >= 0x10000 && i%2 == 0 {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04X`, hi, lo)
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// TestCanonicalJSONRFC8785 runs RFC 8785's own examples, except the one
// number there that is not the shortest form of its double (where this
// canonicalisation keeps the exact value on purpose).
func TestCanonicalJSONRFC8785(t *testing.T) {
	t.Parallel()

	t.Run("Section3.2.2", func(t *testing.T) {
		t.Parallel()

		in := `{
  "numbers": [333333333.3333333, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
		want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],` +
			`"string":"€$\u000f\nA'B\"\\\\\"/"}`
		got, err := canonical.JSON([]byte(in))
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	})

	t.Run("Section3.2.2NonShortestNumber", func(t *testing.T) {
		t.Parallel()

		// RFC 8785 turns 333333333.33333329 into 333333333.3333333 (the
		// nearest double); two amounts that differ must not collide.
		got, err := canonical.JSON([]byte(`[333333333.33333329]`))
		require.NoError(t, err)
		require.Equal(t, `[333333333.33333329]`, string(got))
	})

	t.Run("AppendixBNumbers", func(t *testing.T) {
		t.Parallel()

		// RFC 8785 Appendix B: the double with these bits, written as
		// its shortest round-trip decimal, must serialise as shown.
		tests := []struct {
			bits uint64
			want string
		}{
			{0x0000000000000000, "0"},
			{0x8000000000000000, "0"},
			{0x0000000000000001, "5e-324"},
			{0x8000000000000001, "-5e-324"},
			{0x7fefffffffffffff, "1.7976931348623157e+308"},
			{0xffefffffffffffff, "-1.7976931348623157e+308"},
			{0x4340000000000000, "9007199254740992"},
			{0xc340000000000000, "-9007199254740992"},
			{0x4430000000000000, "295147905179352830000"},
			{0x44b52d02c7e14af5, "9.999999999999997e+22"},
			{0x44b52d02c7e14af6, "1e+23"},
			{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
			{0x444b1ae4d6e2ef4e, "999999999999999700000"},
			{0x444b1ae4d6e2ef4f, "999999999999999900000"},
			{0x444b1ae4d6e2ef50, "1e+21"},
			{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
			{0x3eb0c6f7a0b5ed8d, "0.000001"},
			{0x41b3de4355555553, "333333333.3333332"},
			{0x41b3de4355555554, "333333333.33333325"},
			{0x41b3de4355555555, "333333333.3333333"},
			{0x41b3de4355555556, "333333333.3333334"},
			{0x41b3de4355555557, "333333333.33333343"},
			{0xbecbf647612f3696, "-0.0000033333333333333333"},
			{0x43143ff3c1cb0959, "1424953923781206.2"},
		}
		for _, tt := range tests {
			f := math.Float64frombits(tt.bits)
			for _, format := range []byte{'e', 'f', 'g'} {
				in := canonShortest(f, format)
				got, err := canonical.JSON([]byte(in))
				require.NoError(t, err, in)
				require.Equal(t, tt.want, string(got), "%016x written as %s", tt.bits, in)
			}
		}
	})
}

// TestCanonicalJSONMatchesES6ForDoubles checks the claim that for shortest
// round-trip numbers the output is RFC 8785's, against encoding/json, which
// formats float64 as ECMAScript does.
func TestCanonicalJSONMatchesES6ForDoubles(t *testing.T) {
	t.Parallel()

	rng := rand.New(rand.NewPCG(3, 4))
	for range 20_000 {
		var f float64
		switch rng.IntN(3) {
		case 0: // any finite double
			f = math.Float64frombits(rng.Uint64())
		case 1: // money-like
			f = float64(rng.Int64N(1_000_000_000_000)) / 100
		default: // around the layout boundaries 1e-7 and 1e21
			f = rng.Float64() * math.Pow(10, float64(rng.IntN(32)-10))
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		want, err := json.Marshal(f)
		require.NoError(t, err)
		if string(want) == "-0" {
			want = []byte("0")
		}
		for _, format := range []byte{'e', 'f', 'g'} {
			in := canonShortest(f, format)
			got, err := canonical.JSON([]byte(in))
			require.NoError(t, err, in)
			require.Equal(t, string(want), string(got), "%v written as %s", f, in)
		}
	}
}

// canonShortest writes f as its shortest round-trip decimal in the given
// strconv format, which is always a valid JSON number for a finite f.
func canonShortest(f float64, format byte) string {
	return strconv.FormatFloat(f, format, -1, 64)
}

func TestCanonicalJSONEquivalentDocuments(t *testing.T) {
	t.Parallel()

	// Each group spells one value in different ways; groups differ.
	groups := [][]string{
		{`{"a":1,"b":[true,null]}`, ` { "b" : [ true , null ] , "a" : 1.0 } `, `{"\u0062":[true,null],"a":10e-1}`},
		{`{"a":"é"}`, `{"a":"\u00e9"}`, `{"a":"\u00E9"}`, `{"\u0061":"\u00e9"}`},
		{`"a/b"`, `"a\/b"`, `"\u0061\u002fb"`},
		{`0`, `-0`, `0.0`, `0e10`, `-0E-3`},
		{`12345678901234567890`, `1.234567890123456789e19`, `12345678901234567890.000`},
		{`12345678901234567000`},
		{`0.1`, `1e-1`, `0.10`, `0.01e1`},
		{`1e1000000`, `10e999999`, `0.1e1000001`},
		{`{"a":{}}`, `{"a":{ }}`},
		{`{"a":[]}`},
		{`{}`},
		{`[]`},
		{`""`},
		{`[{"a":1,"b":2},{"b":2,"a":1}]`, `[{"b":2,"a":1},{"a":1,"b":2}]`},
		{`[{"a":1,"b":2},{"b":1,"a":2}]`},
	}
	canon := make([]string, len(groups))
	for i, group := range groups {
		for j, doc := range group {
			got, err := canonical.JSON([]byte(doc))
			require.NoError(t, err, doc)
			if j == 0 {
				canon[i] = string(got)
				continue
			}
			require.Equal(t, canon[i], string(got), "%s and %s", group[0], doc)
		}
	}
	for i := range canon {
		for j := range i {
			require.NotEqual(t, canon[i], canon[j], "%s and %s", groups[i][0], groups[j][0])
		}
	}
}

func TestCanonicalJSONDoesNotAlias(t *testing.T) {
	t.Parallel()

	in := []byte(`{"b":"x", "a":"y"}`)
	inCopy := slices.Clone(in)
	first, err := canonical.JSON(in)
	require.NoError(t, err)
	require.Equal(t, inCopy, in, "input modified")

	// Pooled buffers must not leak into results.
	_, err = canonical.JSON([]byte(`{"z":"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"}`))
	require.NoError(t, err)
	require.Equal(t, `{"a":"y","b":"x"}`, string(first))
}

func TestCanonicalJSONConcurrent(t *testing.T) {
	t.Parallel()

	docs := []string{
		`{"b":1,"a":[{"d":1,"c":2}]}`,
		`[1.50,"\u00e9",{"y":null,"x":true}]`,
		string(testfixture.NestedParams(t)),
	}
	want := make([]string, len(docs))
	for i, doc := range docs {
		got, err := canonical.JSON([]byte(doc))
		require.NoError(t, err)
		want[i] = string(got)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				doc := docs[(g+i)%len(docs)]
				got, err := canonical.JSON([]byte(doc))
				if err != nil {
					errs <- err
					return
				}
				if string(got) != want[(g+i)%len(docs)] {
					errs <- fmt.Errorf("goroutine %d: got %s", g, got)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// FuzzCanonicalJSON checks that JSON never panics, accepts only
// valid JSON, and that what it accepts comes out as compact, valid,
// idempotent JSON with the same value, according to a reference decoder that
// shares no code with it.
func FuzzCanonicalJSON(f *testing.F) {
	f.Add([]byte(`{"b":[1,2.50,"\u00e9"],"a":{"y":null,"x":true}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := canonical.JSON(data)
		if err != nil {
			require.ErrorIs(t, err, canonical.ErrInvalidJSON)
			require.Nil(t, got)
			canonCheckRejection(t, data, err)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON")

		require.True(t, json.Valid(got), "output is not JSON: %q", got)
		var compact bytes.Buffer
		require.NoError(t, json.Compact(&compact, got))
		require.Equal(t, string(got), compact.String(), "output has insignificant whitespace")

		again, err := canonical.JSON(got)
		require.NoError(t, err)
		require.Equal(t, string(got), string(again), "not idempotent")

		// Append, which the fingerprint uses, writes the same bytes after a
		// prefix.
		appended, err := canonical.Append([]byte("flow\x00"), data)
		require.NoError(t, err)
		require.Equal(t, "flow\x00"+string(got), string(appended))

		// The reference decoder is strict: what it refuses (duplicate
		// names, invalid UTF-8, lone surrogates) FuzzCanonicalLoose checks
		// against encoding/json instead.
		want, err := canonRefDecode(data)
		if err != nil {
			return
		}
		back, err := canonRefDecode(got)
		require.NoError(t, err)
		require.True(t, canonRefEqual(want, back), "value changed: %q became %q", data, got)
	})
}

// canonCheckRejection checks that a document JSON refused is
// invalid JSON, or valid JSON refused for one of the documented reasons.
func canonCheckRejection(t *testing.T, data []byte, err error) {
	t.Helper()

	if !json.Valid(data) || !utf8.Valid(data) {
		return
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "differ only in case"):
	case strings.Contains(msg, "nesting deeper than"):
		require.Greater(t, bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")), 10000)
	case strings.Contains(msg, "number out of range"):
		// Only an exponent, or a million digits, can get there.
		require.True(t, bytes.ContainsAny(data, "eE") || len(data) > 1_000_000, "%q: %v", data, err)
	default:
		require.Fail(t, "valid JSON rejected", "%q: %v", data, err)
	}
}

// FuzzCanonicalEqual checks that two accepted documents have the same
// canonical form exactly when they have the same value.
func FuzzCanonicalEqual(f *testing.F) {
	f.Add([]byte(`{"a":1.0,"b":"\u00e9"}`), []byte(`{"b":"é","a":1}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		canonA, err := canonical.JSON(a)
		if err != nil {
			return
		}
		canonB, err := canonical.JSON(b)
		if err != nil {
			return
		}
		// Documents the strict reference decoder refuses (duplicate
		// names, invalid UTF-8) are left to FuzzCanonicalLoose.
		refA, err := canonRefDecode(a)
		if err != nil {
			return
		}
		refB, err := canonRefDecode(b)
		if err != nil {
			return
		}

		require.Equal(t, canonRefEqual(refA, refB), bytes.Equal(canonA, canonB),
			"%q -> %q\n%q -> %q", a, canonA, b, canonB)
	})
}

var (
	errCanonRefDuplicate       = errors.New("duplicate member name")
	errCanonRefUnrepresentable = errors.New("number beyond what the reference decoder computes")
)

// canonRefDecode is the reference decoder: encoding/json's tokenizer, which
// shares no code with this package, numbers as exact big.Rat, objects as maps,
// duplicates refused.
func canonRefDecode(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	v, err := canonRefValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("trailing data: %v", err)
	}
	return v, nil
}

func canonRefValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		switch tok {
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := canonRefValue(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return arr, nil
		case '{':
			obj := map[string]any{}
			for dec.More() {
				nameTok, err := dec.Token()
				if err != nil {
					return nil, err
				}
				name := nameTok.(string) //nolint:forcetypeassert // the tokenizer only yields string names
				if _, dup := obj[name]; dup {
					return nil, fmt.Errorf("%w %q", errCanonRefDuplicate, name)
				}
				v, err := canonRefValue(dec)
				if err != nil {
					return nil, err
				}
				obj[name] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return obj, nil
		}
		return nil, fmt.Errorf("unexpected delimiter %v", tok)
	case json.Number:
		// big.Rat refuses exponents past 1e6 and takes long below that;
		// values that large are covered by table tests instead.
		lower := strings.ToLower(string(tok))
		if i := strings.IndexByte(lower, 'e'); i >= 0 {
			exp := strings.TrimLeft(strings.TrimLeft(lower[i+1:], "+-"), "0")
			if len(exp) > 4 {
				return nil, errCanonRefUnrepresentable
			}
		}
		r, ok := new(big.Rat).SetString(string(tok))
		if !ok {
			return nil, fmt.Errorf("number %s", tok)
		}
		return r, nil
	default:
		return tok, nil // string, bool or nil
	}
}

func canonRefEqual(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for name, va := range a {
			vb, ok := b[name]
			if !ok || !canonRefEqual(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !canonRefEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case *big.Rat:
		b, ok := b.(*big.Rat)
		return ok && a.Cmp(b) == 0
	default:
		return a == b
	}
}

func TestCanonRefDecoder(t *testing.T) {
	t.Parallel()

	// The fuzzers are only as good as their oracle.
	a, err := canonRefDecode([]byte(`{"a":[1.0,"x",null,true],"b":{}}`))
	require.NoError(t, err)
	b, err := canonRefDecode([]byte(`{"b":{},"a":[1,"x",null,true]}`))
	require.NoError(t, err)
	require.True(t, canonRefEqual(a, b))

	for _, other := range []string{
		`{"b":{},"a":[1,"x",null,false]}`, `{"b":{},"a":[1,"x",null]}`, `{"b":[],"a":[1,"x",null,true]}`,
		`{"b":{},"a":[1.01,"x",null,true]}`, `{"b":{},"c":[1,"x",null,true]}`, `{"b":{},"a":[1,"x",null,true],"c":0}`,
	} {
		c, err := canonRefDecode([]byte(other))
		require.NoError(t, err)
		require.False(t, canonRefEqual(a, c), other)
	}

	_, err = canonRefDecode([]byte(`{"a":1,"\u0061":2}`))
	require.ErrorIs(t, err, errCanonRefDuplicate)
	_, err = canonRefDecode([]byte(`1 2`))
	require.Error(t, err)
	_, err = canonRefDecode([]byte(`1e99999`))
	require.ErrorIs(t, err, errCanonRefUnrepresentable)
}

func BenchmarkCanonicalJSON(b *testing.B) {
	testfixture.BenchmarkParams(b, func(params []byte) error {
		_, err := canonical.JSON(params)
		return err
	})
}

// FuzzCanonicalLoose checks Append against encoding/json, the decoder whose
// leniency it mirrors: every document json.Unmarshal reads has a canonical
// form (bar numbers with huge exponents and names that differ only in
// case), that form is idempotent and decodes to the same value.
func FuzzCanonicalLoose(f *testing.F) {
	f.Add([]byte(`{"b":[1,2.50,"\u00e9"],"a":{"y":null,"x":true}}`))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(`{"quantity":1,"QUANTITY":5}`))
	f.Add([]byte("\"\xff\\ud800\\udc00\\udc00\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		loose, err := canonical.Append([]byte("p"), data)
		caseVariants := err != nil && strings.Contains(err.Error(), "differ only in case")
		if err != nil {
			require.ErrorIs(t, err, canonical.ErrInvalidJSON)
			require.Equal(t, "p", string(loose), "an error leaves dst as it was")
			if json.Valid(data) && !caseVariants {
				require.Contains(t, err.Error(), "exponent", "refused what encoding/json reads: %v", err)
			}
			return
		}
		require.True(t, json.Valid(data), "accepted what encoding/json refuses")
		got := loose[1:]
		again, err := canonical.Append(nil, got)
		require.NoError(t, err)
		require.Equal(t, string(got), string(again), "not idempotent")
		var v, back any
		if json.Unmarshal(data, &v) == nil { // numbers beyond float64 do not decode
			require.NoError(t, json.Unmarshal(got, &back))
			require.Equal(t, v, back, "value changed: %q became %q", data, got)
		}
	})
}

func TestAppendIsLenient(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{`{"b":1, "a":2}`, `{"a":2,"b":1}`},
		{`{"a":2,"b":0,"a":1}`, `{"a":2,"a":1,"b":0}`},
		{"\"x\xffy\"", "\"x\uFFFDy\""},
		{`"\ud800x"`, "\"\uFFFDx\""},
		{`"\udc00\ud83d\ude00"`, "\"\uFFFD\U0001F600\""},
	} {
		got, err := canonical.Append(nil, []byte(tt.in))
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, string(got), tt.in)
	}
	deep := strings.Repeat("[", 600) + strings.Repeat("]", 600)
	_, err := canonical.Append(nil, []byte(deep))
	require.NoError(t, err, "as deep as encoding/json reads")
	_, err = canonical.Append(nil, []byte(`{"a":1`))
	require.ErrorIs(t, err, canonical.ErrInvalidJSON)
}

// Two documents that a decoder reads differently must not share a canonical
// form: names that differ only in case are refused, whatever their order.
func TestAppendRefusesCaseVariants(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`{"sku":"A-1","quantity":1,"QUANTITY":5}`,
		`{"sku":"A-1","QUANTITY":5,"quantity":1}`,
		`{"a":{"Note":"x","note":"y"}}`,
		`{"ÉTÉ":1,"été":2}`,
	} {
		_, err := canonical.Append(nil, []byte(doc))
		require.ErrorIs(t, err, canonical.ErrInvalidJSON, doc)
		require.ErrorContains(t, err, "differ only in case", doc)
	}
	// Exact duplicates keep their order, and a large object is checked too.
	_, err := canonical.Append(nil, []byte(`{"a":1,"a":2}`))
	require.NoError(t, err)
	var big strings.Builder
	big.WriteString(`{`)
	for i := range 40 {
		fmt.Fprintf(&big, `"k%d":%d,`, i, i)
	}
	big.WriteString(`"K7":0}`)
	_, err = canonical.Append(nil, []byte(big.String()))
	require.ErrorContains(t, err, `"k7" and "K7" differ only in case`)
}
