const fs=require('fs');const f=process.argv[2];const p=JSON.parse(fs.readFileSync(f));
const self=new Map();const byId=new Map();for(const n of p.nodes)byId.set(n.id,n);
const dt=p.timeDeltas;let total=0;const cnt=new Map();
for(let i=0;i<p.samples.length;i++){const id=p.samples[i];cnt.set(id,(cnt.get(id)||0)+(dt[i]||0));total+=dt[i]||0;}
for(const [id,t] of cnt){const n=byId.get(id);const cf=n.callFrame;const k=`${cf.functionName||'(anon)'} ${cf.url.replace(/.*\/(src|dist|node:)/,'$1')}:${cf.lineNumber+1}`;self.set(k,(self.get(k)||0)+t);}
const arr=[...self].sort((a,b)=>b[1]-a[1]).slice(0,+process.argv[3]||45);
for(const [k,t] of arr)console.log((t/total*100).toFixed(2).padStart(6)+'%  '+k);
