package served

// Templates: a worker that ran a served process's template script
// (protocol/c/served.h) before that process's restore, made when the image
// is loaded (gpucr image load --template). The restored process asks for
// it by the script's token (Serve) and attaches to a worker that holds its
// objects already: no module load, no capture, nothing made again.
//
// A template runs as the user the restored process will be (the image's
// owner), is counted against that user's workers (MaxPerUID), and is given
// only to a process of that user, group and groups on its device: to any
// other the token is no more than a name, and it gets a worker from the
// pool as without one.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
)

// templateOf is what the pool knows of a template.
type templateOf struct {
	token  string
	uid    uint32
	gid    uint32
	groups []uint32 // sorted
	image  string   // the image's directory, as its loader named it
	tag    string   // the caller's name for what it was made for (DropTemplates)
	made   time.Duration
}

// TemplateSpec is a template to make.
type TemplateSpec struct {
	Device int
	// UID, GID and Groups: the user the restored process runs as.
	UID, GID uint32
	Groups   []uint32
	// Script: the template's script, a sealed memfd the caller closes; Token
	// the token its header carries.
	Script *os.File
	Token  []byte
	// Image names the image for Status; Tag what the caller gives up
	// together (DropTemplates).
	Image, Tag string
}

// Template makes a template: a worker of spec.Device takes the user and
// runs the script. It returns how long the script took.
func (p *Pool) Template(spec TemplateSpec) (time.Duration, error) {
	if !p.cfg.Native {
		return 0, ErrNoTemplates
	}
	if spec.Device < 0 || spec.Device >= p.cfg.Devices {
		return 0, fmt.Errorf("no device %d (the helper has %d)", spec.Device, p.cfg.Devices)
	}
	if len(spec.Token) == 0 {
		return 0, errors.New("a template's script without a token")
	}
	token := string(spec.Token)
	p.mu.Lock()
	_, made := p.templates[token]
	p.mu.Unlock()
	if made {
		return 0, nil // the image was loaded before
	}
	w, err := p.takeWorker(spec.Device, spec.UID)
	if err != nil {
		return 0, err
	}
	ready, err := w.assignFor(spec.UID, spec.GID, spec.Groups, 0, int(spec.Script.Fd()), true, p.cfg.TemplateTimeout)
	if err != nil {
		p.drop(w, spec.UID)
		return 0, err
	}
	took := time.Duration(ready.TemplateNs)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.templates[token] != nil {
		p.releaseUIDLocked(spec.UID)
		w.ctl.Close() // it ends, unassigned
		return 0, errors.New("a template of this script was made meanwhile")
	}
	groups := slices.Clone(spec.Groups)
	slices.Sort(groups)
	w.tmpl = &templateOf{token: token, uid: spec.UID, gid: spec.GID, groups: groups, image: spec.Image, tag: spec.Tag, made: took}
	select {
	case <-w.exited: // its script's end was its own
		p.releaseUIDLocked(spec.UID)
		return 0, errors.New("the template's worker ended after its script")
	default:
	}
	p.templates[token] = w
	p.cfg.Log.Info("served mode: template made", zap.Int("pid", w.pid), zap.Int("device", spec.Device),
		zap.Uint32("uid", spec.UID), zap.String("image", spec.Image), zap.Duration("script", took))
	return took, nil
}

// takeTemplate removes and returns the template of token if it is of
// device d and of that user, group and groups (still counted in perUID);
// nil otherwise, the template left where it is.
func (p *Pool) takeTemplate(token []byte, d int, uid, gid uint32, groups []uint32) *Worker {
	if len(token) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.templates[string(token)]
	if w == nil {
		return nil
	}
	t := w.tmpl
	sorted := slices.Clone(groups)
	slices.Sort(sorted)
	if w.device != d || t.uid != uid || t.gid != gid || !slices.Equal(t.groups, sorted) {
		p.cfg.Log.Warn("served mode: a process asked for a template of another user, group or device; it gets a worker from the pool",
			zap.Int("template_device", w.device), zap.Int("device", d), zap.Uint32("template_uid", t.uid), zap.Uint32("uid", uid),
			zap.Uint32("template_gid", t.gid), zap.Uint32("gid", gid))
		return nil
	}
	delete(p.templates, t.token)
	return w
}

// DropTemplates lets the templates made with tag go (their image was given
// up); they end once their control socket closes. It returns how many.
func (p *Pool) DropTemplates(tag string) int {
	p.mu.Lock()
	var drop []*Worker
	for token, w := range p.templates {
		if w.tmpl.tag == tag {
			delete(p.templates, token)
			p.releaseUIDLocked(w.tmpl.uid)
			drop = append(drop, w)
		}
	}
	p.mu.Unlock()
	for _, w := range drop {
		w.ctl.Close()
	}
	return len(drop)
}

// TemplateInfo is one template, for Status.
type TemplateInfo struct {
	Pid    int
	Device int
	UID    uint32
	Image  string
	Tag    string
	Made   time.Duration
}

// Templates lists the templates, by device then pid.
func (p *Pool) Templates() []TemplateInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]TemplateInfo, 0, len(p.templates))
	for _, w := range p.templates {
		out = append(out, TemplateInfo{Pid: w.pid, Device: w.device, UID: w.tmpl.uid, Image: w.tmpl.image, Tag: w.tmpl.tag,
			Made: w.tmpl.made})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Device != out[j].Device {
			return out[i].Device < out[j].Device
		}
		return out[i].Pid < out[j].Pid
	})
	return out
}

// TemplatesOnlyOf says whether every template made with tag is uid's (and
// there is one): a user may give up only their own.
func (p *Pool) TemplatesOnlyOf(tag string, uid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range p.templates {
		if w.tmpl.tag == tag {
			if w.tmpl.uid != uid {
				return false
			}
			n++
		}
	}
	return n > 0
}
