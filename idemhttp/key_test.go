package idemhttp_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	t.Parallel()

	long255 := strings.Repeat("k", 255)
	printable := func() string {
		var b strings.Builder
		for c := byte(0x20); c <= 0x7e; c++ {
			b.WriteByte(c)
		}
		return b.String()
	}()

	tests := []struct {
		name   string
		values []string
		want   string
	}{
		// Bare keys, as Stripe clients send them.
		{"BareUUID", []string{"7c9e6679-7425-40de-944b-e07fc1f90ae7"}, "7c9e6679-7425-40de-944b-e07fc1f90ae7"},
		{"BareSingleChar", []string{"k"}, "k"},
		{"BareMaxLength", []string{long255}, long255},
		{"BareTrimmed", []string{" \t abc-123 \t "}, "abc-123"},
		{"BareInteriorSpace", []string{"abc 123"}, "abc 123"},
		{"BareInteriorQuote", []string{`ab"c`}, `ab"c`},
		{"BareTrailingQuote", []string{`abc"`}, `abc"`},
		{"BareBackslash", []string{`a\b`}, `a\b`},
		{"BareSemicolonIsPartOfKey", []string{"abc;v=1"}, "abc;v=1"},
		{"BareAllPunctuationButComma", []string{"!#$%&'()*+-./:;<=>?@[]^_`{|}~"}, "!#$%&'()*+-./:;<=>?@[]^_`{|}~"},
		{"BareTildeAndDigits", []string{"~0123456789"}, "~0123456789"},

		// sf-strings, as the IETF draft specifies.
		{"String", []string{`"abc-123"`}, "abc-123"},
		{"StringTrimmed", []string{" \t\"abc\" "}, "abc"},
		{"StringSingleChar", []string{`"k"`}, "k"},
		{"StringMaxLength", []string{`"` + long255 + `"`}, long255},
		{"StringMaxLengthAfterUnescape", []string{`"` + strings.Repeat(`\"`, 255) + `"`}, strings.Repeat(`"`, 255)},
		{"StringEscapes", []string{`"a\"b\\c"`}, `a"b\c`},
		{"StringOnlySpaces", []string{`"   "`}, "   "},
		{"StringAllPrintable", []string{idemhttp.FormatKey(printable)}, printable},
		{"StringLooksLikeList", []string{`"a, b"`}, "a, b"},
		{"StringWithComma", []string{`"abc,def"`}, "abc,def"},

		// Parameters are parsed and ignored.
		{"ParamBoolean", []string{`"abc";flag`}, "abc"},
		{"ParamInteger", []string{`"abc";v=-123456789012345`}, "abc"},
		{"ParamDecimal", []string{`"abc";v=123456789012.123`}, "abc"},
		{"ParamString", []string{`"abc";v="x;y=\"z\""`}, "abc"},
		{"ParamToken", []string{`"abc";v=*tok:en/1`}, "abc"},
		{"ParamByteSequence", []string{`"abc";v=:aGVsbG8=:`}, "abc"},
		{"ParamByteSequenceUnpadded", []string{`"abc";v=:aGVsbG8:`}, "abc"},
		{"ParamEmptyByteSequence", []string{`"abc";v=::`}, "abc"},
		{"ParamBooleans", []string{`"abc";a=?0;b=?1`}, "abc"},
		{"ParamDate", []string{`"abc";d=@1659578233`}, "abc"},
		{"ParamDisplayString", []string{`"abc";d=%"f%c3%bc%c3%bc"`}, "abc"},
		{"ParamSpaceAfterSemicolon", []string{`"abc";  a=1; b=2`}, "abc"},
		{"ParamKeyCharacters", []string{`"abc";*a_b-c.d*9=1`}, "abc"},
		{"ParamDuplicate", []string{`"abc";a=1;a=2`}, "abc"},

		// Empty values around the one that counts.
		{"EmptyValuesIgnored", []string{"", "  ", "abc", "\t"}, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := idemhttp.ParseKey(tt.values)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)

			again, err := idemhttp.ParseKey([]string{idemhttp.FormatKey(got)})
			require.NoError(t, err)
			require.Equal(t, got, again)
		})
	}
}

func TestParseKeyMissing(t *testing.T) {
	t.Parallel()

	for _, values := range [][]string{nil, {}, {""}, {" ", "\t", ""}} {
		got, err := idemhttp.ParseKey(values)
		require.ErrorIs(t, err, idemhttp.ErrKeyMissing, "%q", values)
		require.NotErrorIs(t, err, idemhttp.ErrKeyMalformed)
		require.Empty(t, got)
	}
}

func TestParseKeyMalformed(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		values  []string
		wantMsg string
	}{
		// Ambiguity.
		{"TwoValues", []string{"abc", "def"}, "more than one Idempotency-Key header"},
		{"TwoEqualValues", []string{"abc", "abc"}, "more than one Idempotency-Key header"},
		{"TwoValuesAmongEmpty", []string{"", `"abc"`, " ", `"def"`}, "more than one Idempotency-Key header"},
		{"StringList", []string{`"abc", "def"`}, "value is a list of 2 members; send exactly one key"},
		{"StringListNoSpace", []string{`"abc","def"`}, "value is a list of 2 members"},
		{"StringListWithTab", []string{"\"abc\"\t,\t\"def\""}, "value is a list of 2 members"},
		{"StringListOfThree", []string{`"a";p=1, tok, (1 "x");q`}, "value is a list of 3 members"},
		{"StringListOfEmpties", []string{`"", ""`}, "value is a list of 2 members"},
		{"BareList", []string{"k1, k2"}, "comma outside a quoted key at position 2"},
		{"BareComma", []string{"abc,def"}, "comma outside a quoted key at position 3"},
		{"BareThenString", []string{`first-key-aaaa, "second-key-bbbb"`}, "comma outside a quoted key at position 14"},
		{"BareTrailingComma", []string{"abc,"}, "comma outside a quoted key"},
		{"BareLeadingComma", []string{",abc"}, "comma outside a quoted key at position 0"},
		{"BareLongList", []string{strings.Repeat("k", 200) + ", " + strings.Repeat("k", 200)}, "comma outside a quoted key"},
		{"StringListTrailingComma", []string{`"abc",`}, "list ends with a comma at position 6"},
		{"StringListBadMember", []string{`"abc", $x`}, `unexpected '$', expected a value at position 7`},
		{"StringListMissingComma", []string{`"abc", "d" "e"`}, `unexpected '"' in list, expected ','`},
		{"StringListBadInnerList", []string{`"abc", (1,2)`}, `unexpected ',' in inner list`},
		{"StringListUnterminatedInnerList", []string{`"abc", (1 2`}, `unterminated inner list`},

		// Length and characters.
		{"BareTooLong", []string{strings.Repeat("k", 256)}, "key is 256 characters long, the limit is 255"},
		{"StringTooLong", []string{`"` + strings.Repeat("k", 256) + `"`}, "key is 256 characters long, the limit is 255"},
		{"StringEmpty", []string{`""`}, "key is empty"},
		{"StringEmptyWithParams", []string{`"";a=1`}, "key is empty"},
		{"BareNonASCII", []string{"caf\u00e9"}, "key contains byte 0xc3 at position 3; keys are printable ASCII"},
		{"BareDEL", []string{"ab\x7f"}, "key contains byte 0x7f at position 2"},
		{"BareControl", []string{"a\x00b"}, "key contains byte 0x00 at position 1"},
		{"BareInteriorTab", []string{"a\tb"}, "key contains byte 0x09 at position 1"},
		{"BareNewline", []string{"a\r\nb"}, "key contains byte 0x0d at position 1"},
		{"StringNonASCII", []string{"\"caf\u00e9\""}, "byte 0xc3 in sf-string; only printable ASCII is allowed at position 4"},
		{"StringTab", []string{"\"a\tb\""}, "byte 0x09 in sf-string"},
		{"StringDEL", []string{"\"a\x7f\""}, "byte 0x7f in sf-string"},

		// sf-string syntax.
		{"StringUnterminated", []string{`"abc`}, "unterminated sf-string at position 0"},
		{"StringLoneQuote", []string{`"`}, "unterminated sf-string at position 0"},
		{"StringEscapeAtEnd", []string{`"abc\`}, "unterminated sf-string"},
		{"StringBadEscape", []string{`"a\nb"`}, `invalid escape in sf-string (only \" and \\ are allowed) at position 2`},
		{"StringTrailingText", []string{`"abc"def`}, `unexpected 'd' after the sf-string at position 5`},
		{"StringTrailingQuote", []string{`"abc""`}, `unexpected '"' after the sf-string at position 5`},
		{"StringSpaceThenText", []string{`"abc" x`}, `unexpected ' ' after the sf-string at position 5`},
		{"StringSpaceBeforeParams", []string{`"abc" ;a=1`}, `unexpected ' ' after the sf-string`},

		// Parameters.
		{"ParamEmptyName", []string{`"abc";=1`}, `unexpected '=', expected a parameter name at position 6`},
		{"ParamUppercaseName", []string{`"abc";A=1`}, `unexpected 'A', expected a parameter name`},
		{"ParamDigitName", []string{`"abc";1=1`}, `unexpected '1', expected a parameter name`},
		{"ParamTrailingSemicolon", []string{`"abc";`}, `unexpected end of value, expected a parameter name`},
		{"ParamMissingValue", []string{`"abc";a=`}, `unexpected end of value, expected a value`},
		{"ParamBadValue", []string{`"abc";a=$`}, `unexpected '$', expected a value`},
		{"ParamIntegerTooLong", []string{`"abc";a=1234567890123456`}, "integer with more than 15 digits"},
		{"ParamDecimalIntegerPartTooLong", []string{`"abc";a=1234567890123.1`}, "decimal with more than 12 integer digits"},
		{"ParamDecimalTooManyFractionDigits", []string{`"abc";a=1.1234`}, "decimal with more than 3 fraction digits"},
		{"ParamDecimalTrailingDot", []string{`"abc";a=1.`}, "decimal ends with '.'"},
		{"ParamLoneMinus", []string{`"abc";a=-`}, "unexpected end of value, expected a digit"},
		{"ParamNumberThenText", []string{`"abc";a=1x`}, `unexpected 'x' after the sf-string`},
		{"ParamStringUnterminated", []string{`"abc";a="x`}, "unterminated sf-string at position 8"},
		{"ParamBoolean", []string{`"abc";a=?2`}, "expected a boolean ?0 or ?1"},
		{"ParamByteSequenceUnterminated", []string{`"abc";a=:aGk=`}, "unterminated byte sequence"},
		{"ParamByteSequenceBadChar", []string{`"abc";a=:a*b=:`}, `unexpected '*' in byte sequence`},
		{"ParamByteSequenceBadLength", []string{`"abc";a=:aGVsb:`}, "invalid base64 in byte sequence"},
		{"ParamByteSequenceTooMuchPadding", []string{`"abc";a=:aG===:`}, "invalid base64 in byte sequence"},
		{"ParamDateEmpty", []string{`"abc";d=@`}, "unexpected end of value, expected a digit at position 9"},
		{"ListDateEmpty", []string{`"",@`}, "unexpected end of value, expected a digit at position 4"},
		{"ParamDateDecimal", []string{`"abc";d=@1.5`}, "date is not an integer"},
		{"ParamDisplayStringUppercaseHex", []string{`"abc";d=%"%C3%BC"`}, "invalid %-escape in display string"},
		{"ParamDisplayStringInvalidUTF8", []string{`"abc";d=%"%ff"`}, "display string is not valid UTF-8"},
		{"ParamDisplayStringNoQuote", []string{`"abc";d=%x`}, `unexpected 'x', expected '"' after '%'`},
		{"ParamDisplayStringUnterminated", []string{`"abc";d=%"abc`}, "unterminated display string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := idemhttp.ParseKey(tt.values)
			require.ErrorIs(t, err, idemhttp.ErrKeyMalformed)
			require.NotErrorIs(t, err, idemhttp.ErrKeyMissing)
			require.ErrorContains(t, err, tt.wantMsg)
			require.Empty(t, got)
		})
	}
}

func TestFormatKey(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ key, want string }{
		{"abc-123", `"abc-123"`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{`\"`, `"\\\""`},
		{" ", `" "`},
	} {
		require.Equal(t, tt.want, idemhttp.FormatKey(tt.key))
	}

	// An invalid key is not silently changed into another one: the header
	// it produces is refused.
	_, err := idemhttp.ParseKey([]string{idemhttp.FormatKey("caf\u00e9")})
	require.ErrorIs(t, err, idemhttp.ErrKeyMalformed)
	_, err = idemhttp.ParseKey([]string{idemhttp.FormatKey("")})
	require.ErrorIs(t, err, idemhttp.ErrKeyMalformed)
}

// FuzzParseKey feeds up to two header values. Whatever it accepts must be a
// valid key that survives FormatKey and ParseKey unchanged.
func FuzzParseKey(f *testing.F) {
	f.Add(`"abc-123";v=1`, "", false)
	f.Fuzz(func(t *testing.T, first, second string, sendSecond bool) {
		values := []string{first}
		if sendSecond {
			values = append(values, second)
		}
		key, err := idemhttp.ParseKey(values)
		if err != nil {
			require.Empty(t, key)
			missing, isMalformed := errors.Is(err, idemhttp.ErrKeyMissing), errors.Is(err, idemhttp.ErrKeyMalformed)
			require.True(t, missing != isMalformed, "error wraps exactly one sentinel: %v", err)
			return
		}

		require.NotEmpty(t, key)
		require.LessOrEqual(t, len(key), 255)
		for i := range len(key) {
			require.True(t, key[i] >= 0x20 && key[i] <= 0x7e, "byte 0x%02x in key %q", key[i], key)
		}

		again, err := idemhttp.ParseKey([]string{idemhttp.FormatKey(key)})
		require.NoError(t, err)
		require.Equal(t, key, again)

		// A value that is not an sf-string is the key, verbatim.
		var nonEmpty []string
		for _, v := range values {
			if v = strings.Trim(v, " \t"); v != "" {
				nonEmpty = append(nonEmpty, v)
			}
		}
		require.Len(t, nonEmpty, 1)
		if nonEmpty[0][0] != '"' {
			require.Equal(t, nonEmpty[0], key)
			require.NotContains(t, key, ",", "a comma outside a quoted key is never part of one")
		}
	})
}

func BenchmarkParseKey(b *testing.B) {
	for _, bm := range []struct {
		name  string
		value string
	}{
		{"Bare", "7c9e6679-7425-40de-944b-e07fc1f90ae7"},
		{"String", `"7c9e6679-7425-40de-944b-e07fc1f90ae7"`},
		{"StringWithParams", `"7c9e6679-7425-40de-944b-e07fc1f90ae7";v=1;x="y"`},
		{"StringWithEscapes", `"7c9e6679-7425-40de-944b-e07fc1f90ae7\"\\"`},
	} {
		b.Run(bm.name, func(b *testing.B) {
			values := []string{bm.value}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := idemhttp.ParseKey(values); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
