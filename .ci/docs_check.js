// Runs before each page's scripts, so its helpers are the page's globals; records every clip pythreejs plays.
const clips = [];
document.addEventListener('DOMContentLoaded', () => document.querySelector('[type$="view+json"]') &&
  requirejs(['three'], T => {
  const clipAction = T.AnimationMixer.prototype.clipAction;  // pythreejs makes each action with it
  T.AnimationMixer.prototype.clipAction = function (clip, root) {
    const a = clipAction.call(this, clip, root);
    if (!clips.some(v => v.action === a)) clips.push({mixer: this, root: root || this.getRoot(), action: a});
    return a;
  };
}));
const canvases = () => [...document.querySelectorAll('canvas')].filter(c => c.width > 50 && c.height > 50);
const views = () => [...document.querySelectorAll('.trajectory-view')];  // class traj-UID: clip "trajectory UID"
const arr = a => Array.from(a || []);
function inView(el) {  // scrolled to its top, since chromedriver scrolls only to an element wholly off the viewport;
  el.scrollIntoView();  // its size in device pixels, what its screenshot must be (not the strip the viewport showed)
  return ['width', 'height'].map(k => Math.round(el.getBoundingClientRect()[k] * devicePixelRatio)); }
const rec = k => clips.find(v => views()[k].classList.contains('traj-' + v.action.getClip().name.split(' ')[1]));
function parts(v) { const o = {}; v.root.traverse(x => { o[x.isCamera ? 'camera' : x.name] = x; }); return o; }
function scene(k) {  // what the k-th view draws now, what its clip holds and what its visible texts and time labels say
  const v = rec(k), o = parts(v), el = views()[k], g = o.film.geometry;
  const s = {times: [], weights: {}, now: {}, tracks: {}, label: el.innerText,
    base: arr(g.attributes.position.array), targets: g.morphAttributes.position.map(t => arr(t.array)),
    readouts: [...el.querySelectorAll('.widget-readout')].filter(e => e.offsetParent).map(e => e.innerText)};
  for (const t of v.action.getClip().tracks) {
    let m = /^(?!label)(\w+)\.(position|scale)$/.exec(t.name);  // spheres, bodies, the follow camera's placement
    if (m) [s.tracks[t.name], s.now[t.name]] = [arr(t.values), o[m[1]][m[2]].toArray()];
    m = /^film\.morphTargetInfluences\[(\d+)\]$/.exec(t.name);
    if (m) s.times[+m[1]] = t.times[arr(t.values).indexOf(1)];
  }
  for (const n in o) if (/^film(_wire)?$/.test(n)) s.weights[n] = arr(o[n].morphTargetInfluences);
  for (const n in o) if (/^label\d+$/.test(n) && o[n].position.z < 0) s.label += `\nt = ${s.times[+n.slice(5)]} s`;
  return s;
}
function projections(k) {  // the film's model-view-projection at each kept frame, posed by the clip (stop() undoes it)
  const v = rec(k), a = v.action, o = parts(v), times = scene(k).times;
  a.play().paused = true;  // play() returns the action
  const out = times.map(t => {
    a.time = Math.min(t, a.getClip().duration * (1 - 1e-9));
    v.mixer.update(0);
    v.root.updateMatrixWorld(true);
    const camera = o.camera.projectionMatrix.clone().multiply(o.camera.matrixWorldInverse);
    return arr(camera.multiply(o.film.matrixWorld).elements);
  });
  a.stop();
  return out;
}
