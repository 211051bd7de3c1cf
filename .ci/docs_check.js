// Before a page's scripts: record every clip pythreejs plays (it makes each with mixer.clipAction(clip, root)).
window.__views = window.__views || [];
if (!window.__hooked) document.addEventListener('DOMContentLoaded', () => window.__hooked ||
  !document.querySelector('script[type="application/vnd.jupyter.widget-view+json"]') || requirejs(['three'], T => {
    const clipAction = (window.THREE = T).AnimationMixer.prototype.clipAction;
    T.AnimationMixer.prototype.clipAction = function (clip, root) {
      const a = clipAction.call(this, clip, root);
      if (!window.__views.some(v => v.action === a)) window.__views.push({mixer: this, root: root || this.getRoot(), action: a});
      return a;
    };
  }));
window.__hooked = window.__hooked || document.readyState !== 'loading';
const canvases = () => [...document.querySelectorAll('canvas')].filter(c => c.width > 50 && c.height > 50);
const views = () => [...document.querySelectorAll('.trajectory-view')];
const arr = a => Array.from(a || []);
const rec = k => window.__views.find(v => 'traj-' + v.action.getClip().name.split(' ')[1] === [...views()[k].classList].find(
  c => c.startsWith('traj-')));  // a view's class traj-UID names its clip "trajectory UID"
function parts(v) { const o = {}; v.root.traverse(x => { o[x.isCamera ? 'camera' : x.name] = x; }); return o; }
function scene(k) {  // what the k-th view draws now, what its clip holds and what its visible texts and time labels say
  const v = rec(k), o = parts(v), el = views()[k], g = o.film.geometry, s = {times: [], weights: {}, now: {}, tracks: {},
    base: arr(g.attributes.position.array), targets: g.morphAttributes.position.map(t => arr(t.array)),
    label: el.innerText,
    readouts: [...el.querySelectorAll('.widget-readout')].filter(e => e.offsetParent).map(e => e.innerText)};
  for (const t of v.action.getClip().tracks) {
    let m = /^(?!label)(\w+)\.(position|scale)$/.exec(t.name);  // spheres, bodies, and the content's placement (the follow camera)
    if (m) [s.tracks[t.name], s.now[t.name]] = [arr(t.values), o[m[1]][m[2]].toArray()];
    m = /^film\.morphTargetInfluences\[(\d+)\]$/.exec(t.name);
    if (m) s.times[+m[1]] = t.times[arr(t.values).indexOf(1)];
  }
  for (const n in o) if (/^film(_wire)?$/.test(n)) s.weights[n] = arr(o[n].morphTargetInfluences);
  for (const n in o) if (/^label\d+$/.test(n) && o[n].position.z < 0) s.label += `\nt = ${s.times[+n.slice(5)]} s`;
  return s;
}
function fills(k) {  // the share of the canvas the film's projected bounding box covers at each kept frame, posed by
  // the clip (at kept frame i three.js draws morph target i); stop() restores the page's state
  const v = rec(k), a = v.action, o = parts(v), f = o.film, p = new THREE.Vector3(), out = [], times = scene(k).times;
  a.play();
  a.paused = true;
  f.geometry.morphAttributes.position.forEach((m, i) => {
    a.time = Math.min(times[i], a.getClip().duration * (1 - 1e-9));
    v.mixer.update(0);
    v.root.updateMatrixWorld(true);
    const lo = [1, 1], hi = [-1, -1];
    for (let j = 0; j < m.array.length; j += 3) {
      p.fromArray(m.array, j).applyMatrix4(f.matrixWorld).project(o.camera);
      [p.x, p.y].forEach((c, d) => { lo[d] = Math.min(lo[d], c); hi[d] = Math.max(hi[d], c); });
    }
    out.push([0, 1].map(d => Math.max(0, Math.min(1, hi[d]) - Math.max(-1, lo[d])) / 2).reduce((x, y) => x * y));
  });
  a.stop();
  return out;
}
