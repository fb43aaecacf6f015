package daemon

// Served mode's templates (helper/served/template.go): LoadResident with
// template makes, for each served process of the image whose checkpoint
// kept a template script, a worker that ran it, on the device the image's
// memory is placed on and as the user the restored process runs as. The
// restore's Serve then finds it by the script's token (assignWorker).

import (
	"errors"
	"fmt"
	"os/user"
	"slices"
	"strconv"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/served"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// templateTag names the templates of one image directory (DropTemplates).
func templateTag(key residentKey) string { return fmt.Sprintf("%d:%d", key.dev, key.ino) }

// scriptToken is the token in a template script's header
// (protocol/c/served.h: struct sv_script_hdr).
func scriptToken(hdr []byte) ([]byte, error) {
	const magic, version, tokenAt, tokenLen = 0x52435347, 1, 16, 16
	if len(hdr) < tokenAt+tokenLen {
		return nil, errors.New("shorter than its header")
	}
	le := func(b []byte) uint32 { return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24 }
	if le(hdr) != magic || le(hdr[4:]) != version {
		return nil, fmt.Errorf("not a template script of this gpucr (magic %#x, version %d)", le(hdr), le(hdr[4:]))
	}
	return slices.Clone(hdr[tokenAt : tokenAt+tokenLen]), nil
}

// credsOf is the user, group and groups a restored process of the image's
// owner runs as: the caller's own when it is that owner, else the user
// database's.
func credsOf(c *conn, owner uint32) (uid, gid uint32, groups []uint32, err error) {
	if c.cred.Uid == owner {
		groups, err = c.PeerGroups()
		return owner, c.cred.Gid, groups, err
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(owner), 10))
	if err != nil {
		return 0, 0, nil, fmt.Errorf("the image's owner, uid %d: %w", owner, err)
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("uid %d's group %q: %w", owner, u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return 0, 0, nil, fmt.Errorf("uid %d's groups: %w", owner, err)
	}
	for _, s := range ids {
		if n, err := strconv.ParseUint(s, 10, 32); err == nil {
			groups = append(groups, uint32(n))
		}
	}
	return owner, uint32(g), groups, nil
}

// makeTemplates makes the templates of the image im (of owner, in the
// directory key, named dir by the caller), its memory placed by place.
func (s *Server) makeTemplates(c *conn, id uint64, im *image.Image, owner uint32, key residentKey, dir string, place placement) *helperpb.Response {
	if s.served == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "served mode is off in this helper (start it with --served-pool N): no templates")
	}
	uid, gid, groups, err := credsOf(c, owner)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "templates of %s: %v", dir, err)
	}
	made := 0
	for _, p := range im.Processes() {
		if !p.Template {
			continue
		}
		dev := 0 // a process with no memory: the first device
		for _, b := range im.Buffers() {
			if b.Pid == p.Pid {
				if d := place.deviceOf(b); d != nil {
					dev = slices.Index(s.cfg.Devices, d)
				}
				break
			}
		}
		script, err := im.TemplateScript(p.Pid)
		if err != nil {
			code := imageErrCode(err)
			if errors.Is(err, image.ErrTemplateDamaged) {
				code = helperpb.ErrorCode_ERROR_BAD_REQUEST
			}
			return errResp(id, code, "template of process %d of %s: %v", p.Pid, dir, err)
		}
		hdr := make([]byte, 32)
		n, _ := script.ReadAt(hdr, 0)
		token, err := scriptToken(hdr[:n])
		if err != nil {
			script.Close()
			return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "template script of process %d of %s: %v", p.Pid, dir, err)
		}
		took, err := s.served.Template(served.TemplateSpec{Device: dev, UID: uid, GID: gid, Groups: groups, Script: script,
			Token: token, Image: dir, Tag: templateTag(key)})
		script.Close()
		if err != nil {
			code := helperpb.ErrorCode_ERROR_DRIVER
			if errors.Is(err, served.ErrPerUID) {
				code = helperpb.ErrorCode_ERROR_PERMISSION
			}
			s.log.Warn("served mode: no template", zap.String("image", dir), zap.Int("pid", p.Pid), zap.Error(err))
			return errResp(id, code, "template of process %d of %s: %v", p.Pid, dir, err)
		}
		s.log.Info("served mode: template of a process made", zap.String("image", dir), zap.Int("pid", p.Pid),
			zap.Int("device", dev), zap.Duration("script", took))
		made++
	}
	if made == 0 {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND,
			"the image in %s kept no template script: checkpoint a served process with --template", dir)
	}
	return okResp(id)
}

// templatesOf counts the templates waiting, by image tag.
func templatesOf(pool *served.Pool) map[string]uint32 {
	if pool == nil {
		return nil
	}
	out := map[string]uint32{}
	for _, t := range pool.Templates() {
		out[t.Tag]++
	}
	return out
}
