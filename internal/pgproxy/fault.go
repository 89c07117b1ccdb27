package pgproxy

import "strings"

// Rule says which round trips a fault acts on; idemtest.Rule documents it for users. The fields
// that are set must all hold. Round trips count from when the fault is armed, across all the
// proxy's connections, in the order their replies arrive. A fault acts at the first message of a
// reply that reports an outcome, or, with Tag, at the CommandComplete with that tag.
type Rule struct {
	Nth   int    // act on the Nth matching round trip; 0 means 1
	Tag   string // a CommandComplete tag prefix, ignoring case
	SQL   string // text the executed statement contains (case-sensitive)
	Times int    // how many matching round trips to act on, from the Nth; 0 means 1
}

// LoseReply arms a fault that loses the reply to round trips matching rule: the server executes
// the command, the proxy reads the rest of the reply up to ReadyForQuery, discards it, and resets
// the client's connection (TCP RST) and closes the server's.
func (p *Proxy) LoseReply(rule Rule) *Fault { return p.arm(faultLose, rule) }

// StallReply arms a fault that stalls the proxy, as Stall does, when a round trip matching rule
// gets its reply: the server has executed the command, the client waits until Resume.
func (p *Proxy) StallReply(rule Rule) *Fault { return p.arm(faultStall, rule) }

// Fault is an armed fault.
type Fault struct {
	p     *Proxy
	kind  faultKind
	rule  Rule
	after int64 // Commands() when armed: earlier round trips never match
	done  chan struct{}

	// Guarded by p.mu.
	skip  int // matching round trips still to let through
	times int
	fired int
}

type faultKind int

const (
	faultLose faultKind = iota
	faultStall
)

// Done is closed once the fault has acted on as many round trips as its Rule.Times says.
func (f *Fault) Done() <-chan struct{} { return f.done }

// Fired returns how many round trips the fault has acted on so far.
func (f *Fault) Fired() int {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.fired
}

// Disarm removes the fault if it is still armed.
func (f *Fault) Disarm() {
	p := f.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, g := range p.faults {
		if g == f {
			p.faults = append(p.faults[:i], p.faults[i+1:]...)
			p.armed.Add(-1)
			return
		}
	}
}

func (p *Proxy) arm(kind faultKind, rule Rule) *Fault {
	f := &Fault{
		p:     p,
		kind:  kind,
		rule:  rule,
		done:  make(chan struct{}),
		skip:  max(rule.Nth, 1) - 1,
		times: max(rule.Times, 1),
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// armed before after: a round trip that saw no fault armed (and so kept no SQL) was sent
	// before after was read, and can never match.
	p.armed.Add(1)
	f.after = p.commands.Load()
	p.faults = append(p.faults, f)
	return f
}

// matches reports whether f acts on rt at an outcome of its reply (tag is a CommandComplete's,
// nil for other outcomes). It counts each round trip once towards Nth. The caller holds p.mu.
func (f *Fault) matches(rt *roundTrip, tag *string, sqls []string) bool {
	if rt.seq <= f.after {
		return false
	}
	if _, counted := rt.counted[f]; counted {
		return false
	}
	if f.rule.Tag != "" && (tag == nil || !hasPrefixFold(*tag, f.rule.Tag)) {
		return false
	}
	if f.rule.SQL != "" && !containsAny(sqls, f.rule.SQL) {
		return false
	}
	if rt.counted == nil {
		rt.counted = make(map[*Fault]struct{})
	}
	rt.counted[f] = struct{}{}
	if f.skip > 0 {
		f.skip--
		return false
	}
	return true
}

// evaluate runs the armed faults against an outcome of rt's reply and says what to do with it.
func (p *Proxy) evaluate(c *conn, rt *roundTrip, tag *string) (stall, lose bool) {
	c.mu.Lock()
	sqls := rt.sqls
	c.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.faults[:0]
	for _, f := range p.faults {
		if f.matches(rt, tag, sqls) {
			f.fired++
			switch f.kind {
			case faultStall:
				stall = true
			case faultLose:
				lose = true
			}
			if f.fired == f.times {
				close(f.done)
				p.armed.Add(-1)
				continue
			}
		}
		kept = append(kept, f)
	}
	clear(p.faults[len(kept):])
	p.faults = kept
	return stall, lose
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func containsAny(texts []string, sub string) bool {
	for _, t := range texts {
		if strings.Contains(t, sub) {
			return true
		}
	}
	return false
}
