package pgstore

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
)

// checkStatement refuses what a phase may not send through its Tx: a
// transaction-control statement (ErrPhaseEndedTx), at the start of the
// string or anywhere in a string of several statements. pgx sends an Exec
// without arguments over the simple protocol, where a COMMIT later in the
// string would commit the phase's writes without its recovery point.
func checkStatement(sql string) error { return verdictOf(sql).err }

// statementVerdict is what a phase statement's text says about it.
type statementVerdict struct {
	// err refuses it (checkStatement).
	err error
	// mayResetTimeout: it may change the session's statement_timeout
	// (it sets statement_timeout, or is a RESET or DISCARD), which the
	// store otherwise sets once per connection (phaseTx.timeoutSetting).
	mayResetTimeout bool
}

// verdictOf is sql's verdict. It depends on the string alone, and a phase
// sends the same constant SQL on every request: it is kept per string
// (statementVerdicts), so the lexer and the regular expression run once
// per statement text, not once per statement sent.
func verdictOf(sql string) *statementVerdict {
	if v, ok := statementVerdicts.Load(sql); ok {
		return v.(*statementVerdict)
	}
	v := lexStatement(sql)
	if statementVerdictCount.Load() < maxStatementVerdicts {
		if _, loaded := statementVerdicts.LoadOrStore(sql, v); !loaded {
			statementVerdictCount.Add(1)
		}
	}
	return v
}

// statementVerdicts holds verdictOf's verdict per SQL string for at most
// maxStatementVerdicts strings: SQL built per request (values spliced into
// the text) would otherwise grow it without end; beyond the bound such
// strings are lexed every time, as before the cache.
var (
	statementVerdicts     sync.Map
	statementVerdictCount atomic.Int64
)

const maxStatementVerdicts = 4096

// resetsSession matches a statement that may reset the session's settings
// wholesale, after whitespace and comments.
var resetsSession = regexp.MustCompile(`(?is)^(?:\s+|--[^\n]*\n|/\*.*?\*/)*(reset|discard)\b`)

// setsTimeout matches, anywhere in a string (a DO block's EXECUTE
// included), a session-level SET of statement_timeout or a set_config of
// it. SET LOCAL lasts for the phase's transaction only.
var setsTimeout = regexp.MustCompile(`(?is)\bset\s+(session\s+)?statement_timeout\b|\bset_config\s*\(\s*'statement_timeout'`)

// lexStatement is verdictOf without its cache.
func lexStatement(sql string) *statementVerdict {
	v := &statementVerdict{mayResetTimeout: setsTimeout.MatchString(sql)}
	for _, stmt := range statements(sql) {
		if v.err == nil {
			v.err = refuseTxControl(stmt)
		}
		if resetsSession.MatchString(stmt) {
			v.mayResetTimeout = true
		}
	}
	return v
}

// statements splits a SQL string into its statements as Postgres's lexer
// does: at semicolons outside string literals ('...', E'...' with backslash
// escapes), quoted identifiers, dollar-quoted strings and comments (-- to
// the end of the line, nested /* */). Empty statements (blanks and comments
// between semicolons) are left out. An unterminated literal or comment runs
// to the end of the string, as the server would reject it anyway.
func statements(sql string) []string {
	var out []string
	start := 0
	content := false // the current statement has something besides blanks
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ';':
			if content {
				out = append(out, sql[start:i])
				content = false
			}
			i++
			start = i
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			if end := strings.IndexByte(sql[i:], '\n'); end >= 0 {
				i += end + 1
			} else {
				i = len(sql)
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == '\'':
			content = true
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !identChar(sql[i-2]))
			i = skipQuoted(sql, i, '\'', escapes)
		case c == '"':
			content = true
			i = skipQuoted(sql, i, '"', false)
		case c == '$' && (i == 0 || !identChar(sql[i-1])):
			content = true
			i = skipDollar(sql, i)
		default:
			content = true
			i++
		}
	}
	if content {
		out = append(out, sql[start:])
	}
	return out
}

func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// skipBlockComment returns the index after the (nested) comment at i.
func skipBlockComment(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case sql[i] == '/' && i+1 < len(sql) && sql[i+1] == '*':
			depth++
			i += 2
		case sql[i] == '*' && i+1 < len(sql) && sql[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

// skipQuoted returns the index after the literal quoted by q at i; a doubled
// quote is part of it, and so is a backslash-escaped character when escapes.
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for i++; i < len(sql); i++ {
		switch {
		case escapes && sql[i] == '\\':
			i++
		case sql[i] == q && i+1 < len(sql) && sql[i+1] == q:
			i++
		case sql[i] == q:
			return i + 1
		}
	}
	return i
}

// skipDollar returns the index after the dollar-quoted string at i, or after
// the $ when it starts none (a parameter such as $1).
func skipDollar(sql string, i int) int {
	j := i + 1
	for j < len(sql) && sql[j] != '$' {
		c := sql[j]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || j > i+1 && c >= '0' && c <= '9') {
			return i + 1
		}
		j++
	}
	if j >= len(sql) {
		return i + 1
	}
	tag := sql[i : j+1]
	if end := strings.Index(sql[j+1:], tag); end >= 0 {
		return j + 1 + end + len(tag)
	}
	return len(sql)
}
